"""The demo site's data: a flat product list and a small shop with orders.

Built with ``sqlite3`` directly, once per run and before gunicorn starts, from a
fixed seed, so every backend is measured against the same rows. The light route
reads the 1,000 products (one indexed scan); the heavy route joins order lines,
orders, products and customers and aggregates them (what a report or a
dashboard does), so that caching it saves a real computation.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

PRODUCTS = 1_000
CUSTOMERS = 2_000
ORDERS = 10_000
LINES_PER_ORDER = 3
CATEGORIES = ("books", "garden", "kitchen", "music", "office", "outdoor", "sport", "toys")
COUNTRIES = ("de", "fr", "it", "nl", "pl", "pt", "se", "uk")

SCHEMA = """
CREATE TABLE product (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                      price INTEGER NOT NULL);
CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customer,
                     created TEXT NOT NULL);
CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders,
                         product_id INTEGER NOT NULL REFERENCES product,
                         qty INTEGER NOT NULL, price INTEGER NOT NULL);
CREATE INDEX order_line_order ON order_line(order_id);
"""


def seed(path: str | Path, seed_value: int = 0) -> None:
    """Create the database at ``path`` (it must not exist) with its rows."""
    rng = random.Random(seed_value)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executemany(
            "INSERT INTO product VALUES (?, ?, ?, ?)",
            [(i, f"product {i}", rng.choice(CATEGORIES), rng.randrange(100, 100_000))
             for i in range(1, PRODUCTS + 1)],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO customer VALUES (?, ?, ?)",
            [(i, f"customer {i}", rng.choice(COUNTRIES)) for i in range(1, CUSTOMERS + 1)],
        )
        conn.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)",
            [(i, rng.randrange(1, CUSTOMERS + 1), f"2026-{rng.randrange(1, 13):02d}-01")
             for i in range(1, ORDERS + 1)],
        )  # fmt: skip
        conn.executemany(
            "INSERT INTO order_line (order_id, product_id, qty, price) VALUES (?, ?, ?, ?)",
            [(o, rng.randrange(1, PRODUCTS + 1), rng.randrange(1, 5), rng.randrange(100, 100_000))
             for o in range(1, ORDERS + 1) for _ in range(LINES_PER_ORDER)],
        )  # fmt: skip
        conn.commit()
    finally:
        conn.close()
