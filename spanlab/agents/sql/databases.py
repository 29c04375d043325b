"""Four small SQLite databases for the SQL tutorial, generated deterministically in code.

Why generated and not downloaded: the task set must build offline, identically on every machine, and
its gold answers must come from the very rows the agent queries. Each database is a few tables of
10-40 rows (company, shop, library, school), built from a fixed seed, so every value a question
mentions exists and every gold query returns rows (checked in ``tasks.py``).

Columns a question orders by (salaries, prices, pages, ...) hold distinct values, so "the 3 highest"
has one answer. The file for a database lives at ``<cache>/sql/<name>-<digest>.sqlite``, where
``<cache>`` is ``$SPANLAB_CACHE`` or ``~/.cache/spanlab`` and the digest hashes the contents: a change
to the data here gives a new file, never a stale one. Files are written to a temp name and renamed,
so concurrent workers never see a half-built database.

``schema_text(name)`` is the compact ``CREATE TABLE`` text that prompts show the model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spanlab.engine.model import cache_root

logger = logging.getLogger(__name__)

Value = int | float | str


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]  # "name TYPE[ REFERENCES t(id)]", as in the CREATE TABLE statement
    rows: tuple[tuple[Value, ...], ...]

    def create_statement(self) -> str:
        return f"CREATE TABLE {self.name} ({', '.join(self.columns)});"


@dataclass(frozen=True)
class Database:
    name: str
    tables: tuple[Table, ...]

    def schema(self) -> str:
        """One ``CREATE TABLE`` line per table: what the model needs and nothing else (short prompts)."""
        return "\n".join(t.create_statement() for t in self.tables)

    def digest(self) -> str:
        """A hash of schema and rows: the file name changes whenever the contents do."""
        return hashlib.sha256(repr((self.schema(), [t.rows for t in self.tables])).encode()).hexdigest()[:12]


FIRST_NAMES = (
    "Alice", "Bruno", "Chen", "Dana", "Emil", "Fatima", "Gabe", "Hana", "Ivan", "Jade", "Kofi", "Lena",
    "Marco", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wes", "Ximena",
    "Yusuf", "Zara", "Aaron", "Bella", "Carlos", "Dmitri", "Elena", "Felix", "Greta", "Hugo", "Iris", "Jonas",
)  # fmt: skip
LAST_NAMES = ("Smith", "Garcia", "Kim", "Novak", "Okafor", "Rossi", "Silva", "Tanaka", "Weber", "Young")
CITIES = ("Boston", "Denver", "Austin", "Chicago", "Seattle")


def _people(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct full names (first names are unique, so full names are too)."""
    return [f"{first} {rng.choice(LAST_NAMES)}" for first in rng.sample(FIRST_NAMES, n)]


def _distinct(rng: random.Random, low: int, high: int, step: int, n: int) -> list[int]:
    return rng.sample(range(low, high + 1, step), n)


def _company(rng: random.Random) -> Database:
    departments = [
        (1, "Sales", "Boston", 250000), (2, "Engineering", "Seattle", 900000), (3, "Marketing", "Chicago", 300000),
        (4, "Finance", "Boston", 200000), (5, "Support", "Denver", 150000), (6, "Research", "Seattle", 600000),
    ]  # fmt: skip
    titles = ("Manager", "Engineer", "Analyst", "Clerk", "Designer")
    names, salaries = _people(rng, 36), _distinct(rng, 40000, 150000, 500, 36)
    dept_ids = [i % len(departments) + 1 for i in range(36)]
    rng.shuffle(dept_ids)
    employees = [
        (i + 1, names[i], rng.choice(titles), dept_ids[i], salaries[i], rng.randint(2010, 2023)) for i in range(36)
    ]
    return Database("company", (
        Table("departments", ("id INTEGER PRIMARY KEY", "name TEXT", "city TEXT", "budget INTEGER"),
              tuple(departments)),
        Table("employees", ("id INTEGER PRIMARY KEY", "name TEXT", "title TEXT",
                            "department_id INTEGER REFERENCES departments(id)", "salary INTEGER",
                            "hire_year INTEGER"), tuple(employees)),
    ))  # fmt: skip


def _shop(rng: random.Random) -> Database:
    catalog = {
        "Books": ("Cookbook", "Atlas", "Novel", "Dictionary"),
        "Toys": ("Puzzle", "Kite", "Robot", "Yo-yo"),
        "Garden": ("Shovel", "Hose", "Rake", "Planter"),
        "Kitchen": ("Kettle", "Blender", "Pan", "Toaster"),
        "Office": ("Stapler", "Lamp", "Notebook", "Chair"),
    }
    prices = [p / 100 for p in _distinct(rng, 299, 9999, 50, 20)]
    products = [
        (i + 1, name, category, prices[i])
        for i, (category, name) in enumerate((c, n) for c, names in catalog.items() for n in names)
    ]
    names = _people(rng, 24)
    customers = [(i + 1, names[i], rng.choice(CITIES), rng.randint(2015, 2023)) for i in range(24)]
    orders = [
        (i + 1, rng.randint(1, 24), rng.randint(1, 20), rng.randint(1, 9), rng.randint(2020, 2024)) for i in range(40)
    ]
    return Database("shop", (
        Table("customers", ("id INTEGER PRIMARY KEY", "name TEXT", "city TEXT", "joined_year INTEGER"),
              tuple(customers)),
        Table("products", ("id INTEGER PRIMARY KEY", "name TEXT", "category TEXT", "price REAL"), tuple(products)),
        Table("orders", ("id INTEGER PRIMARY KEY", "customer_id INTEGER REFERENCES customers(id)",
                         "product_id INTEGER REFERENCES products(id)", "quantity INTEGER", "order_year INTEGER"),
              tuple(orders)),
    ))  # fmt: skip


def _library(rng: random.Random) -> Database:
    countries = ("France", "Japan", "Brazil", "Canada", "Nigeria")
    author_names = _people(rng, 12)
    authors = [(i + 1, author_names[i], countries[i % 5], rng.randint(1900, 1990)) for i in range(12)]
    words = ("River", "Winter", "Garden", "Shadow", "Silver", "Harbor", "Mountain", "Lantern", "Storm", "Orchard")
    kinds = ("Song", "Map", "Letters", "Secret", "Journey", "House")
    titles = rng.sample([f"The {w} {k}" for w in words for k in kinds], 30)
    genres = ("Mystery", "Fantasy", "History", "Poetry", "Science")
    pages = _distinct(rng, 90, 900, 5, 30)
    books = [(i + 1, titles[i], i % 12 + 1, rng.choice(genres), rng.randint(1950, 2022), pages[i]) for i in range(30)]
    members = _people(rng, 15)
    loans = [(i + 1, rng.randint(1, 30), rng.choice(members), rng.randint(2019, 2024), rng.randint(3, 60))
             for i in range(40)]  # fmt: skip
    return Database("library", (
        Table("authors", ("id INTEGER PRIMARY KEY", "name TEXT", "country TEXT", "birth_year INTEGER"),
              tuple(authors)),
        Table("books", ("id INTEGER PRIMARY KEY", "title TEXT", "author_id INTEGER REFERENCES authors(id)",
                        "genre TEXT", "year INTEGER", "pages INTEGER"), tuple(books)),
        Table("loans", ("id INTEGER PRIMARY KEY", "book_id INTEGER REFERENCES books(id)", "member TEXT",
                        "loan_year INTEGER", "days INTEGER"), tuple(loans)),
    ))  # fmt: skip


def _school(rng: random.Random) -> Database:
    names = _people(rng, 30)
    ages = [rng.randint(17, 26) for _ in range(30)]
    students = [(i + 1, names[i], ages[i], rng.choice(CITIES)) for i in range(30)]
    courses = [
        (1, "Algebra", "Math", 4), (2, "Statistics", "Math", 3), (3, "Biology", "Science", 4),
        (4, "Chemistry", "Science", 4), (5, "Physics", "Science", 5), (6, "Poetry", "Arts", 2),
        (7, "Painting", "Arts", 3), (8, "History", "Humanities", 3), (9, "Philosophy", "Humanities", 2),
        (10, "Economics", "Humanities", 3),
    ]  # fmt: skip
    pairs = rng.sample([(s, c) for s in range(1, 31) for c in range(1, 11)], 40)
    scores = _distinct(rng, 40, 100, 1, 40)
    enrollments = [(s, c, score) for (s, c), score in zip(sorted(pairs), scores, strict=True)]
    return Database("school", (
        Table("students", ("id INTEGER PRIMARY KEY", "name TEXT", "age INTEGER", "city TEXT"), tuple(students)),
        Table("courses", ("id INTEGER PRIMARY KEY", "title TEXT", "department TEXT", "credits INTEGER"),
              tuple(courses)),
        Table("enrollments", ("student_id INTEGER REFERENCES students(id)",
                              "course_id INTEGER REFERENCES courses(id)", "score INTEGER"), tuple(enrollments)),
    ))  # fmt: skip


BUILDERS: dict[str, Callable[[random.Random], Database]] = {
    "company": _company,
    "shop": _shop,
    "library": _library,
    "school": _school,
}
DATABASE_NAMES: tuple[str, ...] = tuple(BUILDERS)


def database(name: str) -> Database:
    """The database ``name`` (schema and rows), the same on every call and machine."""
    if name not in BUILDERS:
        raise ValueError(f"unknown SQL database {name!r} (known: {', '.join(DATABASE_NAMES)})")
    return BUILDERS[name](random.Random(f"spanlab-sql-db:{name}"))


def schema_text(name: str) -> str:
    """The compact ``CREATE TABLE`` lines of ``name`` that prompts show."""
    return database(name).schema()


def write_database(db: Database, path: Path) -> None:
    """Write ``db`` to a new SQLite file at ``path`` (temp file + rename: never half-built)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with sqlite3.connect(tmp) as conn:
            for table in db.tables:
                conn.execute(table.create_statement())
                marks = ", ".join("?" * len(table.columns))
                conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", table.rows)
        conn.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def db_path(name: str, root: Path | None = None) -> Path:
    """The SQLite file of database ``name``, built on first use under ``root`` (default: the spanlab cache)."""
    db = database(name)
    path = (root or cache_root() / "sql") / f"{name}-{db.digest()}.sqlite"
    if not path.exists():
        write_database(db, path)
        logger.info("built SQL database %s at %s", name, path)
    return path
