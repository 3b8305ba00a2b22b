"""The MQTT door: the daemon (`hayakoe-pi run`) and its parts, from a `say` admitted to its receipt.
It joins the broker link, the speech service, the sound card and the Wyoming server."""
