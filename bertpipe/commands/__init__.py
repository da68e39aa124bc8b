"""One module per ``bertpipe`` subcommand (see bertpipe/cli.py). Keep imports here light."""
