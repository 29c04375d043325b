"""Question templates of the SQL task set: a question, its gold SQL, and where the slot values come from.

Each template's ``slots`` is itself a query over the template's database, so slot values are always
real values (a city that exists, a salary someone earns) and the question space grows with the data:
about 200-300 distinct questions per level per database. ``{0}``, ``{1}`` in ``question`` get the
plain values, in ``sql`` their SQL literals. Levels: 1 = one table, filter and select; 2 = one table,
aggregates, GROUP BY, ORDER BY ... LIMIT; 3 = joins. Templates whose slots give an empty or NULL
result are dropped when the task set is built (``tasks.py``), so no threshold needs hand-tuning.
ORDER BY ... LIMIT is only used on columns whose values are distinct (``databases.py``), so the
gold answer is unique.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    level: int
    db: str
    question: str
    sql: str
    slots: str | None = None  # a query whose rows are the slot values; None: the template has no slots


def _t(level: int, db: str, question: str, sql: str, slots: str | None = None) -> Template:
    return Template(level, db, question, sql, slots)


_YEARS = "SELECT DISTINCT hire_year FROM employees ORDER BY 1"
_SALARIES = "SELECT salary FROM employees ORDER BY 1"
_TITLES = "SELECT DISTINCT title FROM employees ORDER BY 1"
_DEPTS = "SELECT name FROM departments ORDER BY 1"
_EMPLOYEES = "SELECT name FROM employees ORDER BY 1"
_KS = "SELECT value FROM (SELECT 2 AS value UNION SELECT 3 UNION SELECT 4 UNION SELECT 5)"

COMPANY = (
    _t(1, "company", "List the names of employees whose title is {0}.",
       "SELECT name FROM employees WHERE title = {0}", _TITLES),
    _t(1, "company", "List the names of employees who earn more than {0}.",
       "SELECT name FROM employees WHERE salary > {0}", _SALARIES),
    _t(1, "company", "List the names of employees who earn less than {0}.",
       "SELECT name FROM employees WHERE salary < {0}", _SALARIES),
    _t(1, "company", "Which employees were hired in {0}?", "SELECT name FROM employees WHERE hire_year = {0}", _YEARS),
    _t(1, "company", "What is the salary of {0}?", "SELECT salary FROM employees WHERE name = {0}", _EMPLOYEES),
    _t(1, "company", "What is the title of {0}?", "SELECT title FROM employees WHERE name = {0}", _EMPLOYEES),
    _t(1, "company", "In which year was {0} hired?", "SELECT hire_year FROM employees WHERE name = {0}", _EMPLOYEES),
    _t(1, "company", "List the names of {0}s hired before {1}.",
       "SELECT name FROM employees WHERE title = {0} AND hire_year < {1}",
       f"SELECT t.title, y.hire_year FROM ({_TITLES}) t, ({_YEARS}) y"),
    _t(1, "company", "Which departments are located in {0}?",
       "SELECT name FROM departments WHERE city = {0}", "SELECT DISTINCT city FROM departments ORDER BY 1"),
    _t(1, "company", "What is the budget of the {0} department?",
       "SELECT budget FROM departments WHERE name = {0}", _DEPTS),
    _t(2, "company", "How many employees have the title {0}?",
       "SELECT COUNT(*) FROM employees WHERE title = {0}", _TITLES),
    _t(2, "company", "What is the average salary of employees whose title is {0}?",
       "SELECT AVG(salary) FROM employees WHERE title = {0}", _TITLES),
    _t(2, "company", "How many employees were hired after {0}?",
       "SELECT COUNT(*) FROM employees WHERE hire_year > {0}", _YEARS),
    _t(2, "company", "What is the highest salary of employees hired in {0}?",
       "SELECT MAX(salary) FROM employees WHERE hire_year = {0}", _YEARS),
    _t(2, "company", "How many employees earn more than {0}?",
       "SELECT COUNT(*) FROM employees WHERE salary > {0}", _SALARIES),
    _t(2, "company", "List the names of the {0} employees with the highest salaries.",
       "SELECT name FROM employees ORDER BY salary DESC LIMIT {0}", _KS),
    _t(2, "company", "List the names of the {0} employees with the lowest salaries.",
       "SELECT name FROM employees ORDER BY salary ASC LIMIT {0}", _KS),
    _t(2, "company", "For each title, how many employees have it?",
       "SELECT title, COUNT(*) FROM employees GROUP BY title"),
    _t(2, "company", "What is the total salary of employees hired before {0}?",
       "SELECT SUM(salary) FROM employees WHERE hire_year < {0}", _YEARS),
    _t(2, "company", "Who is the highest paid {0}?",
       "SELECT name FROM employees WHERE title = {0} ORDER BY salary DESC LIMIT 1", _TITLES),
    _t(2, "company", "How many employees earn less than {0}?",
       "SELECT COUNT(*) FROM employees WHERE salary < {0}", _SALARIES),
    _t(2, "company", "What is the average salary of employees hired in {0}?",
       "SELECT AVG(salary) FROM employees WHERE hire_year = {0}", _YEARS),
    _t(3, "company", "List the names of employees in the {0} department.",
       "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0}", _DEPTS),
    _t(3, "company", "How many employees work in the {0} department?",
       "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0}", _DEPTS),
    _t(3, "company", "What is the average salary in the {0} department?",
       "SELECT AVG(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0}",
       _DEPTS),
    _t(3, "company", "Which department does {0} work in?",
       "SELECT d.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE e.name = {0}", _EMPLOYEES),
    _t(3, "company", "In which city does {0} work?",
       "SELECT d.city FROM employees e JOIN departments d ON e.department_id = d.id WHERE e.name = {0}", _EMPLOYEES),
    _t(3, "company", "List the names of employees who work in {0}.",
       "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.city = {0}",
       "SELECT DISTINCT city FROM departments ORDER BY 1"),
    _t(3, "company", "Who is the highest paid employee in the {0} department?",
       "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0} "
       "ORDER BY e.salary DESC LIMIT 1", _DEPTS),
    _t(3, "company", "List the names of {1}s in the {0} department.",
       "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0} "
       "AND e.title = {1}", f"SELECT d.name, t.title FROM ({_DEPTS}) d, ({_TITLES}) t"),
    _t(3, "company", "List the names of employees in the {0} department hired after {1}.",
       "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = {0} "
       "AND e.hire_year > {1}", f"SELECT d.name, y.hire_year FROM ({_DEPTS}) d, ({_YEARS}) y"),
    _t(3, "company", "For each department name, what is the total salary of its employees?",
       "SELECT d.name, SUM(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id GROUP BY d.name"),
)  # fmt: skip

_CATEGORIES = "SELECT DISTINCT category FROM products ORDER BY 1"
_PRICES = "SELECT price FROM products ORDER BY 1"
_PRODUCTS = "SELECT name FROM products ORDER BY 1"
_CUSTOMERS = "SELECT name FROM customers ORDER BY 1"
_SHOP_CITIES = "SELECT DISTINCT city FROM customers ORDER BY 1"
_ORDER_YEARS = "SELECT DISTINCT order_year FROM orders ORDER BY 1"
_JOINED = "SELECT DISTINCT joined_year FROM customers ORDER BY 1"
_ORDERS_JOIN = "FROM orders o JOIN customers c ON o.customer_id = c.id"
_ITEMS_JOIN = "FROM orders o JOIN products p ON o.product_id = p.id"

SHOP = (
    _t(1, "shop", "List the names of products in the {0} category.",
       "SELECT name FROM products WHERE category = {0}", _CATEGORIES),
    _t(1, "shop", "Which products cost more than {0}?", "SELECT name FROM products WHERE price > {0}", _PRICES),
    _t(1, "shop", "Which products cost less than {0}?", "SELECT name FROM products WHERE price < {0}", _PRICES),
    _t(1, "shop", "What is the price of the {0}?", "SELECT price FROM products WHERE name = {0}", _PRODUCTS),
    _t(1, "shop", "Which category is the {0} in?", "SELECT category FROM products WHERE name = {0}", _PRODUCTS),
    _t(1, "shop", "List the names of customers from {0}.", "SELECT name FROM customers WHERE city = {0}",
       _SHOP_CITIES),
    _t(1, "shop", "Which city is {0} from?", "SELECT city FROM customers WHERE name = {0}", _CUSTOMERS),
    _t(1, "shop", "Which customers joined in {0}?", "SELECT name FROM customers WHERE joined_year = {0}", _JOINED),
    _t(1, "shop", "List the names of customers from {0} who joined after {1}.",
       "SELECT name FROM customers WHERE city = {0} AND joined_year > {1}",
       f"SELECT c.city, j.joined_year FROM ({_SHOP_CITIES}) c, ({_JOINED}) j"),
    _t(2, "shop", "How many products are in the {0} category?",
       "SELECT COUNT(*) FROM products WHERE category = {0}", _CATEGORIES),
    _t(2, "shop", "What is the average price of products in the {0} category?",
       "SELECT AVG(price) FROM products WHERE category = {0}", _CATEGORIES),
    _t(2, "shop", "What is the most expensive product in the {0} category?",
       "SELECT name FROM products WHERE category = {0} ORDER BY price DESC LIMIT 1", _CATEGORIES),
    _t(2, "shop", "List the names of the {0} cheapest products.",
       "SELECT name FROM products ORDER BY price ASC LIMIT {0}", _KS),
    _t(2, "shop", "List the names of the {0} most expensive products.",
       "SELECT name FROM products ORDER BY price DESC LIMIT {0}", _KS),
    _t(2, "shop", "How many customers are from {0}?", "SELECT COUNT(*) FROM customers WHERE city = {0}",
       _SHOP_CITIES),
    _t(2, "shop", "How many orders were placed in {0}?", "SELECT COUNT(*) FROM orders WHERE order_year = {0}",
       _ORDER_YEARS),
    _t(2, "shop", "What is the total quantity ordered in {0}?",
       "SELECT SUM(quantity) FROM orders WHERE order_year = {0}", _ORDER_YEARS),
    _t(2, "shop", "How many products cost more than {0}?", "SELECT COUNT(*) FROM products WHERE price > {0}",
       _PRICES),
    _t(2, "shop", "For each city, how many customers are from it?",
       "SELECT city, COUNT(*) FROM customers GROUP BY city"),
    _t(2, "shop", "For each category, what is the highest product price?",
       "SELECT category, MAX(price) FROM products GROUP BY category"),
    _t(2, "shop", "How many products cost less than {0}?", "SELECT COUNT(*) FROM products WHERE price < {0}",
       _PRICES),
    _t(2, "shop", "How many customers joined after {0}?", "SELECT COUNT(*) FROM customers WHERE joined_year > {0}",
       _JOINED),
    _t(3, "shop", "How many orders did {0} place?", f"SELECT COUNT(*) {_ORDERS_JOIN} WHERE c.name = {{0}}",
       _CUSTOMERS),
    _t(3, "shop", "Which products did {0} order?",
       "SELECT DISTINCT p.name FROM orders o JOIN customers c ON o.customer_id = c.id JOIN products p "
       "ON o.product_id = p.id WHERE c.name = {0}", _CUSTOMERS),
    _t(3, "shop", "Which customers ordered the {0}?",
       "SELECT DISTINCT c.name FROM orders o JOIN customers c ON o.customer_id = c.id JOIN products p "
       "ON o.product_id = p.id WHERE p.name = {0}", _PRODUCTS),
    _t(3, "shop", "What is the total quantity of {0} ordered?",
       f"SELECT SUM(o.quantity) {_ITEMS_JOIN} WHERE p.name = {{0}}", _PRODUCTS),
    _t(3, "shop", "How many orders are for products in the {0} category?",
       f"SELECT COUNT(*) {_ITEMS_JOIN} WHERE p.category = {{0}}", _CATEGORIES),
    _t(3, "shop", "How many orders were placed by customers from {0}?",
       f"SELECT COUNT(*) {_ORDERS_JOIN} WHERE c.city = {{0}}", _SHOP_CITIES),
    _t(3, "shop", "Which customers placed an order in {0}?",
       f"SELECT DISTINCT c.name {_ORDERS_JOIN} WHERE o.order_year = {{0}}", _ORDER_YEARS),
    _t(3, "shop", "Which products were ordered in {0}?",
       f"SELECT DISTINCT p.name {_ITEMS_JOIN} WHERE o.order_year = {{0}}", _ORDER_YEARS),
    _t(3, "shop", "Which customers from {0} ordered a product from the {1} category?",
       "SELECT DISTINCT c.name FROM orders o JOIN customers c ON o.customer_id = c.id JOIN products p "
       "ON o.product_id = p.id WHERE c.city = {0} AND p.category = {1}",
       f"SELECT c.city, k.category FROM ({_SHOP_CITIES}) c, ({_CATEGORIES}) k"),
)  # fmt: skip

_GENRES = "SELECT DISTINCT genre FROM books ORDER BY 1"
_PAGES = "SELECT pages FROM books ORDER BY 1"
_BOOKS = "SELECT title FROM books ORDER BY 1"
_AUTHORS = "SELECT name FROM authors ORDER BY 1"
_COUNTRIES = "SELECT DISTINCT country FROM authors ORDER BY 1"
_MEMBERS = "SELECT DISTINCT member FROM loans ORDER BY 1"
_DECADES = "SELECT value FROM (SELECT 1960 AS value UNION SELECT 1970 UNION SELECT 1980 UNION SELECT 1990 " \
           "UNION SELECT 2000 UNION SELECT 2010)"  # fmt: skip
_BOOKS_JOIN = "FROM books b JOIN authors a ON b.author_id = a.id"
_LOANS_JOIN = "FROM loans l JOIN books b ON l.book_id = b.id"

LIBRARY = (
    _t(1, "library", "List the titles of {0} books.", "SELECT title FROM books WHERE genre = {0}", _GENRES),
    _t(1, "library", "Which books have more than {0} pages?", "SELECT title FROM books WHERE pages > {0}", _PAGES),
    _t(1, "library", "Which books have fewer than {0} pages?", "SELECT title FROM books WHERE pages < {0}", _PAGES),
    _t(1, "library", "Which books were published before {0}?", "SELECT title FROM books WHERE year < {0}",
       _DECADES),
    _t(1, "library", "How many pages does {0} have?", "SELECT pages FROM books WHERE title = {0}", _BOOKS),
    _t(1, "library", "In which year was {0} published?", "SELECT year FROM books WHERE title = {0}", _BOOKS),
    _t(1, "library", "What is the genre of {0}?", "SELECT genre FROM books WHERE title = {0}", _BOOKS),
    _t(1, "library", "List the names of authors from {0}.", "SELECT name FROM authors WHERE country = {0}",
       _COUNTRIES),
    _t(1, "library", "In which year was the author {0} born?", "SELECT birth_year FROM authors WHERE name = {0}",
       _AUTHORS),
    _t(1, "library", "List the titles of {0} books published after {1}.",
       "SELECT title FROM books WHERE genre = {0} AND year > {1}",
       f"SELECT g.genre, d.value FROM ({_GENRES}) g, ({_DECADES}) d"),
    _t(2, "library", "How many {0} books are there?", "SELECT COUNT(*) FROM books WHERE genre = {0}", _GENRES),
    _t(2, "library", "What is the average number of pages of {0} books?",
       "SELECT AVG(pages) FROM books WHERE genre = {0}", _GENRES),
    _t(2, "library", "List the titles of the {0} longest books.",
       "SELECT title FROM books ORDER BY pages DESC LIMIT {0}", _KS),
    _t(2, "library", "List the titles of the {0} shortest books.",
       "SELECT title FROM books ORDER BY pages ASC LIMIT {0}", _KS),
    _t(2, "library", "What is the longest {0} book?",
       "SELECT title FROM books WHERE genre = {0} ORDER BY pages DESC LIMIT 1", _GENRES),
    _t(2, "library", "How many books were published after {0}?", "SELECT COUNT(*) FROM books WHERE year > {0}",
       _DECADES),
    _t(2, "library", "How many loans did {0} make?", "SELECT COUNT(*) FROM loans WHERE member = {0}", _MEMBERS),
    _t(2, "library", "What is the total number of loan days of {0}?",
       "SELECT SUM(days) FROM loans WHERE member = {0}", _MEMBERS),
    _t(2, "library", "For each genre, how many books are there?", "SELECT genre, COUNT(*) FROM books GROUP BY genre"),
    _t(2, "library", "How many books have more than {0} pages?", "SELECT COUNT(*) FROM books WHERE pages > {0}",
       _PAGES),
    _t(2, "library", "How many books have fewer than {0} pages?", "SELECT COUNT(*) FROM books WHERE pages < {0}",
       _PAGES),
    _t(2, "library", "How many loans lasted more than {0} days?", "SELECT COUNT(*) FROM loans WHERE days > {0}",
       "SELECT DISTINCT days FROM loans ORDER BY 1"),
    _t(3, "library", "List the titles of books written by {0}.", f"SELECT b.title {_BOOKS_JOIN} WHERE a.name = {{0}}",
       _AUTHORS),
    _t(3, "library", "Who wrote {0}?", f"SELECT a.name {_BOOKS_JOIN} WHERE b.title = {{0}}", _BOOKS),
    _t(3, "library", "How many books were written by authors from {0}?",
       f"SELECT COUNT(*) {_BOOKS_JOIN} WHERE a.country = {{0}}", _COUNTRIES),
    _t(3, "library", "List the titles of books by authors from {0}.",
       f"SELECT b.title {_BOOKS_JOIN} WHERE a.country = {{0}}", _COUNTRIES),
    _t(3, "library", "Which country is the author of {0} from?",
       f"SELECT a.country {_BOOKS_JOIN} WHERE b.title = {{0}}", _BOOKS),
    _t(3, "library", "Which books did {0} borrow?", f"SELECT DISTINCT b.title {_LOANS_JOIN} WHERE l.member = {{0}}",
       _MEMBERS),
    _t(3, "library", "Who borrowed {0}?", f"SELECT DISTINCT l.member {_LOANS_JOIN} WHERE b.title = {{0}}", _BOOKS),
    _t(3, "library", "How many loans were of {0} books?", f"SELECT COUNT(*) {_LOANS_JOIN} WHERE b.genre = {{0}}",
       _GENRES),
    _t(3, "library", "What is the longest book written by {0}?",
       f"SELECT b.title {_BOOKS_JOIN} WHERE a.name = {{0}} ORDER BY b.pages DESC LIMIT 1", _AUTHORS),
    _t(3, "library", "List the titles of {1} books by authors from {0}.",
       f"SELECT b.title {_BOOKS_JOIN} WHERE a.country = {{0}} AND b.genre = {{1}}",
       f"SELECT c.country, g.genre FROM ({_COUNTRIES}) c, ({_GENRES}) g"),
)  # fmt: skip

_STUDENTS = "SELECT name FROM students ORDER BY 1"
_COURSES = "SELECT title FROM courses ORDER BY 1"
_SCHOOL_CITIES = "SELECT DISTINCT city FROM students ORDER BY 1"
_AGES = "SELECT DISTINCT age FROM students ORDER BY 1"
_COURSE_DEPTS = "SELECT DISTINCT department FROM courses ORDER BY 1"
_SCORES = "SELECT DISTINCT score FROM enrollments ORDER BY 1"
_ENROLLED = "FROM enrollments en JOIN students s ON en.student_id = s.id JOIN courses c ON en.course_id = c.id"

SCHOOL = (
    _t(1, "school", "List the names of students from {0}.", "SELECT name FROM students WHERE city = {0}",
       _SCHOOL_CITIES),
    _t(1, "school", "Which students are {0} years old?", "SELECT name FROM students WHERE age = {0}", _AGES),
    _t(1, "school", "Which students are older than {0}?", "SELECT name FROM students WHERE age > {0}", _AGES),
    _t(1, "school", "How old is {0}?", "SELECT age FROM students WHERE name = {0}", _STUDENTS),
    _t(1, "school", "Which city is {0} from?", "SELECT city FROM students WHERE name = {0}", _STUDENTS),
    _t(1, "school", "List the titles of courses in the {0} department.",
       "SELECT title FROM courses WHERE department = {0}", _COURSE_DEPTS),
    _t(1, "school", "How many credits is {0} worth?", "SELECT credits FROM courses WHERE title = {0}", _COURSES),
    _t(1, "school", "Which courses are worth more than {0} credits?", "SELECT title FROM courses WHERE credits > {0}",
       "SELECT DISTINCT credits FROM courses ORDER BY 1"),
    _t(1, "school", "List the names of students from {0} younger than {1}.",
       "SELECT name FROM students WHERE city = {0} AND age < {1}",
       f"SELECT c.city, a.age FROM ({_SCHOOL_CITIES}) c, ({_AGES}) a"),
    _t(2, "school", "How many students are from {0}?", "SELECT COUNT(*) FROM students WHERE city = {0}",
       _SCHOOL_CITIES),
    _t(2, "school", "What is the average age of students from {0}?", "SELECT AVG(age) FROM students WHERE city = {0}",
       _SCHOOL_CITIES),
    _t(2, "school", "How many students are older than {0}?", "SELECT COUNT(*) FROM students WHERE age > {0}", _AGES),
    _t(2, "school", "How many courses does the {0} department offer?",
       "SELECT COUNT(*) FROM courses WHERE department = {0}", _COURSE_DEPTS),
    _t(2, "school", "What is the total number of credits of {0} courses?",
       "SELECT SUM(credits) FROM courses WHERE department = {0}", _COURSE_DEPTS),
    _t(2, "school", "For each city, how many students are from it?",
       "SELECT city, COUNT(*) FROM students GROUP BY city"),
    _t(2, "school", "For each department, how many courses does it offer?",
       "SELECT department, COUNT(*) FROM courses GROUP BY department"),
    _t(2, "school", "How many enrollments have a score above {0}?",
       "SELECT COUNT(*) FROM enrollments WHERE score > {0}", _SCORES),
    _t(2, "school", "What is the average score of all enrollments in course {0}?",
       "SELECT AVG(score) FROM enrollments WHERE course_id = {0}", "SELECT id FROM courses ORDER BY 1"),
    _t(2, "school", "What are the {0} highest scores?", "SELECT score FROM enrollments ORDER BY score DESC LIMIT {0}",
       _KS),
    _t(2, "school", "How many enrollments have a score below {0}?",
       "SELECT COUNT(*) FROM enrollments WHERE score < {0}", _SCORES),
    _t(2, "school", "What is the highest score in course {0}?",
       "SELECT MAX(score) FROM enrollments WHERE course_id = {0}", "SELECT id FROM courses ORDER BY 1"),
    _t(3, "school", "Which courses is {0} enrolled in?", f"SELECT c.title {_ENROLLED} WHERE s.name = {{0}}",
       _STUDENTS),
    _t(3, "school", "Which students are enrolled in {0}?", f"SELECT s.name {_ENROLLED} WHERE c.title = {{0}}",
       _COURSES),
    _t(3, "school", "How many students are enrolled in {0}?", f"SELECT COUNT(*) {_ENROLLED} WHERE c.title = {{0}}",
       _COURSES),
    _t(3, "school", "What is the average score in {0}?", f"SELECT AVG(en.score) {_ENROLLED} WHERE c.title = {{0}}",
       _COURSES),
    _t(3, "school", "What is the highest score of {0}?", f"SELECT MAX(en.score) {_ENROLLED} WHERE s.name = {{0}}",
       _STUDENTS),
    _t(3, "school", "Who has the highest score in {0}?",
       f"SELECT s.name {_ENROLLED} WHERE c.title = {{0}} ORDER BY en.score DESC LIMIT 1", _COURSES),
    _t(3, "school", "Which students scored more than {1} in {0}?",
       f"SELECT s.name {_ENROLLED} WHERE c.title = {{0}} AND en.score > {{1}}",
       f"SELECT c.title, v.score FROM ({_COURSES}) c, ({_SCORES}) v"),
    _t(3, "school", "Which students from {0} take a course in the {1} department?",
       f"SELECT DISTINCT s.name {_ENROLLED} WHERE s.city = {{0}} AND c.department = {{1}}",
       f"SELECT c.city, d.department FROM ({_SCHOOL_CITIES}) c, ({_COURSE_DEPTS}) d"),
    _t(3, "school", "How many credits is {0} taking in total?", f"SELECT SUM(c.credits) {_ENROLLED} "
       "WHERE s.name = {0}", _STUDENTS),
)  # fmt: skip

TEMPLATES: tuple[Template, ...] = COMPANY + SHOP + LIBRARY + SCHOOL
