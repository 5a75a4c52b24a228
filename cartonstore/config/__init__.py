"""The settings: one TOML file (``config/cartonstore.toml`` documents every
key), the environment, then command-line flags, each overriding the one
before.

load.py: ``load_config`` -> ``Config``; one module per section, each a
frozen dataclass read from its table: server.py ([server]), fetch.py
([fetch]), peers.py ([peers]), registries.py ([registries]), hf.py ([hf]),
runners.py ([runners]), with the value parsers they share in values.py and runner
command templates in runner_command.py. pulling.py builds the standard
Puller (every kind of source cartonstore reads) for the daemon and the CLI.
Names are imported on first use (`cartonstore --help` reads no settings).
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {"load": "Config load_config",
                                                     "pulling": "standard_puller standard_sources"})

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .load import Config, load_config
    from .pulling import standard_puller, standard_sources
