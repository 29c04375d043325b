"""The training-job framework: config, the ``Algorithm`` protocol, the registry, the job an algorithm runs in.

Light on import (no torch, no web stack): ``spanlab train --check`` loads this and the chosen
algorithm's config only.
"""
