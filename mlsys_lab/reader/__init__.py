"""The reader's side of the project: the start page, the set-up doctor, launching JupyterLab and
the offline HTML export."""
