"""The demo site's views and URLs (``ROOT_URLCONF``).

Routes, each light and heavy: uncached; under ``cache_page``; through
``cache.get_or_set``. Plus a cache-backed session, a write that invalidates the
low-level light entry (the freshness check reads it back from every worker),
and a slow computation behind ``get_or_set`` for the stampede measurement,
which logs every start of the computation so the harness can count them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.base import BaseCache
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import path
from django.views.decorators.cache import cache_page

#: Low-level cache keys of the two computations.
LIGHT_KEY = "demo:products"
HEAVY_KEY = "demo:report"
PAGE_SECONDS = 60

HEAVY_SQL = """
SELECT p.category, COUNT(DISTINCT o.id), COUNT(DISTINCT o.customer_id), SUM(l.qty * l.price)
FROM order_line l JOIN orders o ON o.id = l.order_id JOIN product p ON p.id = l.product_id
JOIN customer c ON c.id = o.customer_id
GROUP BY p.category ORDER BY 4 DESC
"""
TOP_SQL = """
SELECT c.country, c.name, SUM(l.qty * l.price) AS spent
FROM order_line l JOIN orders o ON o.id = l.order_id JOIN customer c ON c.id = o.customer_id
GROUP BY c.id ORDER BY spent DESC LIMIT 20
"""


def _json(data: Any) -> HttpResponse:
    return HttpResponse(json.dumps(data), content_type="application/json")


def products() -> list[list[Any]]:
    with connection.cursor() as cur:
        cur.execute("SELECT id, name, category, price FROM product ORDER BY id")
        return [list(row) for row in cur.fetchall()]


def report() -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute(HEAVY_SQL)
        categories = [list(row) for row in cur.fetchall()]
        cur.execute(TOP_SQL)
        top = [list(row) for row in cur.fetchall()]
    return {"categories": categories, "top_customers": top}


def light(request: HttpRequest) -> HttpResponse:
    return _json(products())


def heavy(request: HttpRequest) -> HttpResponse:
    return _json(report())


def light_lowlevel(request: HttpRequest) -> HttpResponse:
    return _json(cache.get_or_set(LIGHT_KEY, products, PAGE_SECONDS))


def heavy_lowlevel(request: HttpRequest) -> HttpResponse:
    return _json(cache.get_or_set(HEAVY_KEY, report, PAGE_SECONDS))


def session(request: HttpRequest) -> HttpResponse:
    count = request.session.get("count", 0) + 1
    request.session["count"] = count
    return _json({"count": count})


def price(request: HttpRequest, product_id: int) -> HttpResponse:
    """POST ``price=N``: change a product, then invalidate the cached list."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    new = int(request.POST["price"])
    with connection.cursor() as cur:
        cur.execute("UPDATE product SET price = %s WHERE id = %s", [new, product_id])
    cache.delete(LIGHT_KEY)
    return _json({"id": product_id, "price": new})


def stampede(request: HttpRequest, key: str) -> HttpResponse:
    """``get_or_set`` of a slow computation; ``?protect=0`` uses Django's own
    ``BaseCache.get_or_set`` (what every Django cache does: no protection).

    Logs, beside the computations (``KEY.log``, a line each), when each request
    reached the view (``KEY.arrivals``) and when each computation ended
    (``KEY.done``), wall-clock seconds: the probe counts how many requests
    arrived while the first computation ran, which is what makes a stampede."""
    logs = Path(settings.DJCB_LOG_DIR)
    log = logs / f"{key}.log"
    with open(logs / f"{key}.arrivals", "a") as f:
        f.write(f"{time.time():.6f}\n")

    def compute() -> str:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(settings.DJCB_COMPUTE_SECONDS)
        with open(logs / f"{key}.done", "a") as f:
            f.write(f"{time.time():.6f}\n")
        return f"computed by {os.getpid()}"

    name = f"demo:stampede:{key}"
    if request.GET.get("protect") == "0":
        value = BaseCache.get_or_set(cache, name, compute, PAGE_SECONDS)
    else:
        value = cache.get_or_set(name, compute, PAGE_SECONDS)
    return _json({"value": value})


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def warm(request: HttpRequest) -> HttpResponse:
    """One cache read: opens this thread's cache instance and connections."""
    cache.get("demo:warm")
    return HttpResponse("ok")


urlpatterns = [
    path("ping", ping),
    path("warm", warm),
    path("light/", light),
    path("light/page/", cache_page(PAGE_SECONDS)(light)),
    path("light/lowlevel/", light_lowlevel),
    path("heavy/", heavy),
    path("heavy/page/", cache_page(PAGE_SECONDS)(heavy)),
    path("heavy/lowlevel/", heavy_lowlevel),
    path("session/", session),
    path("product/<int:product_id>/price", price),
    path("stampede/<slug:key>/", stampede),
]
