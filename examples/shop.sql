-- The example shop's own tables, in the application's schema (public), next to skiplock's.
-- The Flask, FastAPI, SQLAlchemy and CSV recipes use them; the Django recipe makes the same two
-- tables with its own migration.

-- An order that takes more than is available fails this CHECK: a failure late in the request's
-- transaction, after the task was enqueued, which takes the task away with the order.
CREATE TABLE stock (
    item      text    PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);

CREATE TABLE orders (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item            text        NOT NULL REFERENCES stock (item),
    quantity        integer     NOT NULL CHECK (quantity > 0),
    -- the CSV import's row reference (NULL for orders placed through an app)
    reference       text        UNIQUE,
    receipt_sent_at timestamptz
);
