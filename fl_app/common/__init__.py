"""The bottom room of the Flower app: shared I/O and background helpers, the run folder's files
and their schema, the parsing of inject-faults. Imports nothing of fl_app's."""
