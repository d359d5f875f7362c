"""Minimal Django settings for the test suite (pytest-django)."""

SECRET_KEY = "djcachebench-tests-not-secret-0123456789"
USE_TZ = True
INSTALLED_APPS = ["djcachebench"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
