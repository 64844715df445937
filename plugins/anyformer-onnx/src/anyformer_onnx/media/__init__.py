"""Image and audio inputs: decoding, preprocessing, log-mel, the media encoders, and media in a chat prompt."""
