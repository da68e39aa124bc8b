import sys

from bertpipe.cli import main

sys.exit(main())
