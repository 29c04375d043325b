"""Package data: chat templates spanlab ships (a package so setuptools package-data includes them)."""
