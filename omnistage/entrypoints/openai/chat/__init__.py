"""POST /v1/chat/completions: text, image and audio in; text, audio or images out."""
