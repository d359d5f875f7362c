"""App config: add ``"djcachebench"`` to INSTALLED_APPS for system checks and
the ``cachebench`` management command (the backends work without it)."""

from django.apps import AppConfig


class DjCacheBenchConfig(AppConfig):
    name = "djcachebench"
    verbose_name = "djcachebench"

    def ready(self) -> None:
        from . import checks, checks_django, checks_tiered  # noqa: F401  (registers the checks)

        checks_django.install()
