"""OmniVoice (k2-fsa): text -> speech by iterative unmasking of codec codes (see speaker.py)."""
