"""Whisper-style speech recognition: the handle and long-form transcription."""
