"""WS /v1/video/chat/stream: live video understanding (frames and audio in, answers out), see session.py."""
