"""A voice borrowed from the household's voice server: what a room and a hayakoe-pi server add to Wyoming."""
