from compose2sif.cli import main

main()
