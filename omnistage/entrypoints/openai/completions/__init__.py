"""POST /v1/completions: a prompt (text or token ids, one or a list) in, text out."""
