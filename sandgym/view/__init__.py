"""`sandgym view`: a local web viewer for run folders (eval, BFCL, SWE debug/validate,
training and SFT). `runs.py` reads the folders, `index.py` pages huge results files
without loading them, `app.py` serves the JSON API and the static front-end (`static/`)."""
