"""Tutorial agents that spanlab trains (registered by short name in ``spanlab.runner.agent``)."""
