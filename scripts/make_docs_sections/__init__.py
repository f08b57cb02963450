"""The generators behind scripts/make_docs.py, one file per kind of section: command outputs, quoted input files,
the gallery pictures and the executed notebooks; docs_runner holds what they share (the scratch folder, running
``autoplan``, code fences, PNG shrinking)."""
