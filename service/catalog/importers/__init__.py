"""Other projects' releases (EnvScaler, BFCL, tau-bench) imported as catalog packages."""
