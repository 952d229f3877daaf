<c2s-forward.py of the package>
