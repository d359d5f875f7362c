"""Settings of the demo site, read from the JSON file named by ``DJCB_HTTP_CONFIG``.

Why a file and not a settings module per backend: the harness writes one small
JSON per run (the target's ``CACHES`` entry as ``bench`` builds it, the data
base path, the directory where computations are logged) and every gunicorn
worker reads the same one, so all workers of a run share exactly one cache
configuration.
"""

from __future__ import annotations

import json
import os

with open(os.environ["DJCB_HTTP_CONFIG"]) as _file:
    _config = json.load(_file)

SECRET_KEY = _config["secret_key"]
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "djcachebench.bench.http.views"
INSTALLED_APPS = ["django.contrib.sessions"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _config["db"]}}
CACHES = {"default": _config["cache"]}
SESSION_ENGINE = "django.contrib.sessions.backends.cache"
USE_TZ = True
LOGGING_CONFIG = None
DJCB_LOG_DIR = _config["log_dir"]
DJCB_COMPUTE_SECONDS = float(_config.get("compute_seconds", 0.2))
