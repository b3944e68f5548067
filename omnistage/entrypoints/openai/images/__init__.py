"""POST /v1/images/generations and POST /v1/images/edits."""
