"""Command-line tools shipped with shuniu, each a plugin that adds its commands through the
``register_commands`` hook: ``simulate``, ``plan``, ``sim_serve`` (``shuniu sim serve``) and
``bench``. A tool uses other packages only through their public API (``shuniu.core.traffic``,
``shuniu.backends.sim``, another tool's package), never their modules."""
