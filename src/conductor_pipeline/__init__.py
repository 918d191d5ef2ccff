"""conductor-pipeline: train, evaluate, serve and retrain a Conductor that orchestrates worker LLMs."""

__version__ = "0.1.0"
