"""What the owner set: config.yaml (config), the changes made at run time and kept across restarts
(runtime), and the announcements' chime, volume and quiet hours."""
