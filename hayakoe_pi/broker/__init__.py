"""The link to the MQTT broker: the connection (link), the payloads read and written, the topics,
Home Assistant discovery, and the outbox of what waits for the broker."""
