"""Text → samples: the engine (front end, voice, decoder windows), decoding, sentences, synthesis
ahead of playback, and the latents an 8-bit decoder is calibrated with."""
