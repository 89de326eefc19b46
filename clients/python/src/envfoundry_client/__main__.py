import sys

from envfoundry_client.cli import main

sys.exit(main())
