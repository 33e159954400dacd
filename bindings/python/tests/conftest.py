pytest_plugins = ["servers", "patience"]
