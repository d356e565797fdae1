"""Who may do what on a public app: the access policy decided at start-up (`policy.py`) and each visitor's uploaded
files (`uploads.py`)."""
