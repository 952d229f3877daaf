"""The state shared by one load: the parsed documents, where each service was defined, warnings."""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load.discovery import read_text
from compose2sif.load.yaml_source import Document, load_documents

# Parsed files, by path and text, for a process that loads a project twice (`convert` loads
# again with generated secrets). Safe to share: the loader only reads a Document (collect_resets
# copies what it keeps). A few entries: a long-running caller does not grow it.
_PARSED: Dict[Tuple[str, str], List[Document]] = {}


def _parsed_documents(path: str, text: str) -> List[Document]:
    key = (path, text)
    if key not in _PARSED:
        if len(_PARSED) >= 16:
            _PARSED.clear()
        _PARSED[key] = load_documents(path, text)
    return _PARSED[key]



class LoadContext:
    """State shared by one load: where each service was defined, and the documents read."""

    def __init__(self) -> None:
        self.origins: Dict[str, Tuple[str, Optional[int]]] = {}
        self.documents: Dict[str, Document] = {}  # service -> the document that last set it
        self.warnings: List[str] = []
        self._unset: Set[str] = set()
        self._parsed: Dict[str, List[Document]] = {}

    def parsed_documents(self) -> List[Document]:
        return [doc for docs in self._parsed.values() for doc in docs]

    def documents_of(self, path: str) -> List[Document]:
        """The YAML documents of a file, parsed once per load (the loader only reads them)."""
        if path not in self._parsed:
            self._parsed[path] = _parsed_documents(path, read_text(path))
        return self._parsed[path]

    def unset_variable(self, name: str) -> None:
        if name not in self._unset:
            self._unset.add(name)
            self.warnings.append(f"the {name!r} variable is not set; using an empty string")

    def error_in(self, exc: ComposeError, doc: Optional[Document]) -> ComposeError:
        if exc.file is None and doc is not None:
            parts = tuple(p for p in (exc.path or "").split(".") if p)
            exc.file, exc.line = doc.filename, doc.line_of(*parts) if parts else None
        return exc

