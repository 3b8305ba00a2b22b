"""The sound card: the player (sounddevice → PortAudio → ALSA), the card kept open between
announcements, and the chime."""
