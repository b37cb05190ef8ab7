"""kproxy's configuration: one table of options, read from YAML, the environment and flags alike.

Every option is declared once in :data:`OPTIONS` with its YAML path, its parser and its help;
its flag and its environment variable are derived from the path (``limits.max_in_flight`` ->
``--limits-max-in-flight`` and ``KPROXY_LIMITS_MAX_IN_FLIGHT``), so no option exists in one
layer and not another, nor under two names. Precedence: built-in default < config file <
environment < flag.

Invalid configuration is refused before anything starts (:class:`ConfigError`), every problem
of every layer at once, each naming where and why, e.g.
``kproxy.yaml:3: limits.max_in_flight: must be an integer >= 1, got 'many'``.

The modules, one job each:

* :mod:`.model`     - :class:`Config` and its sections (the values and their defaults);
* :mod:`.values`    - the parser of each kind of value;
* :mod:`.options`   - the option table, and the names derived from each path;
* :mod:`.yaml_file` - a config file read with the line of each key;
* :mod:`.flags`     - ``kproxy run``'s flags and their deprecated aliases;
* :mod:`.layering`  - file, environment and flags merged, parsed and checked.
"""

from kproxy.config.flags import Deprecation, add_run_arguments, deprecation_notes
from kproxy.config.layering import (
    KNOWN_VARIABLES,
    build_config,
    config_from_args,
    config_from_file,
    is_loopback,
    read_environment,
)
from kproxy.config.options import OPTIONS, Alias, Option, builtin_default, env_name, flag_name
from kproxy.config.sections import (
    AdminOptions,
    CaptureOptions,
    ClientTls,
    Config,
    ConfigError,
    FileSections,
    Limits,
    MetricsOptions,
    SaslClient,
    SaslUpstream,
    UpstreamTls,
)
from kproxy.config.values import LOG_FORMATS
from kproxy.config.yaml_file import ConfigFile, read_config_file

__all__ = [
    "KNOWN_VARIABLES",
    "LOG_FORMATS",
    "OPTIONS",
    "AdminOptions",
    "Alias",
    "CaptureOptions",
    "ClientTls",
    "Config",
    "ConfigError",
    "ConfigFile",
    "Deprecation",
    "FileSections",
    "Limits",
    "MetricsOptions",
    "Option",
    "SaslClient",
    "SaslUpstream",
    "UpstreamTls",
    "add_run_arguments",
    "build_config",
    "builtin_default",
    "config_from_args",
    "config_from_file",
    "deprecation_notes",
    "env_name",
    "flag_name",
    "is_loopback",
    "read_config_file",
    "read_environment",
]
