"""``python -m corral`` runs the command line."""

from corral.cli.main import main

main()
