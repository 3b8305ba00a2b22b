"""The speech service both doors use: the voice and style chosen, the user dictionary, and text →
samples through the phrase cache."""
