pytest_plugins = ["servers"]
