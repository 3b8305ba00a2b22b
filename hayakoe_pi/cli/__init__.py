"""The command line: `hayakoe-pi` and its commands (main), their flags (args), `check` (check),
and what the commands share (context). `python -m hayakoe_pi.cli` runs main.main."""
