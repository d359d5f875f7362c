"""The WSGI entry point gunicorn loads (``djcachebench.bench.http.wsgi:application``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djcachebench.bench.http.site_settings")
application = get_wsgi_application()
