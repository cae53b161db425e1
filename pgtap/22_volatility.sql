-- Every function that can raise for bad input is VOLATILE (the rule in
-- sql/src/20_checks.sql): the planner runs an IMMUTABLE call with constant
-- arguments ahead of time, and a STABLE one while estimating, even where a
-- WHERE or CASE would never reach it; PostgreSQL 18 plans a LANGUAGE sql
-- function's statements with its arguments as constants, so dq_stats()
-- raised "queue must not be NULL" (issue 27).
BEGIN;
SELECT plan(14);

-- pgdq's own functions (an extension or a plain install)
CREATE TEMP TABLE ours AS
SELECT
    p.proname::text AS fn,
    p.prosrc,
    p.provolatile,
    p.proretset
FROM pg_proc AS p
INNER JOIN pg_type AS t ON p.pronamespace = t.typnamespace
WHERE t.oid = 'dq_delivery'::regtype AND p.proname LIKE 'dq\_%';

-- the functions that can raise: a RAISE of an error in the body, or a call
-- of one that can (by name, as every body writes them)
CREATE TEMP TABLE raising AS
WITH RECURSIVE r (fn) AS (
    SELECT o.fn FROM ours AS o
    WHERE o.prosrc ~* '\mRAISE\M(?!\s+(WARNING|NOTICE|INFO|LOG|DEBUG)\M)'
    UNION
    SELECT o.fn FROM ours AS o
    INNER JOIN r ON o.prosrc ~ ('\m' || r.fn || '\s*\(')
)

SELECT o.* FROM ours AS o
WHERE o.fn IN (SELECT r.fn FROM r);

SELECT ok(
    (
        SELECT count(*) FROM raising AS r
        WHERE r.fn IN ('dq__null_check', 'dq__check_queue', 'dq_stats', 'dq_offer')
    ) = 4,
    'the raising functions are found: the checkers and the public functions calling them'
);
SELECT is(
    (
        SELECT array_agg(r.fn ORDER BY r.fn) FROM raising AS r
        WHERE r.provolatile <> 'v' AND r.fn LIKE 'dq\_\_%'
    ),
    NULL, 'every internal function that can raise, or calls one that can, is VOLATILE'
);
-- Public functions keep the volatility their users see. A set-returning one
-- is never run ahead of time (the planner folds no set-returning call), and
-- each check in it is a VOLATILE call; dq_next_due and dq_cron_next stay
-- STABLE so that a query's index scan can use their value (plpgsql: a check
-- statement in them is planned only when reached).
SELECT is(
    (
        SELECT array_agg(r.fn ORDER BY r.fn) FROM raising AS r
        WHERE r.provolatile <> 'v' AND r.fn NOT LIKE 'dq\_\_%' AND NOT r.proretset
    ),
    ARRAY['dq_cron_next', 'dq_next_due'],
    'the public functions that can raise and are not VOLATILE: set-returning ones, dq_next_due and dq_cron_next'
);

-- Reading every queue: the check of a NULL queue is guarded and never runs.
SELECT lives_ok('SELECT count(*) FROM dq_stats()', 'dq_stats() reads every queue');
SELECT lives_ok('SELECT count(*) FROM dq_dead_stats()', 'dq_dead_stats() reads every queue');
SELECT lives_ok('SELECT count(*) FROM dq_schedules()', 'dq_schedules() reads every queue');
SELECT lives_ok('SELECT count(*) FROM dq_read_messages(NULL, 1, 2)', 'dq_read_messages reads every queue');
SELECT lives_ok('SELECT count(*) FROM dq_read_dead_letters(NULL, 1, 2)', 'dq_read_dead_letters reads every queue');
SELECT lives_ok($$SELECT count(*) FROM dq_read_bounds('messages', NULL)$$, 'dq_read_bounds reads every queue');

-- the same from a LANGUAGE sql function of the caller's, its queue NULL
CREATE FUNCTION pg_temp.rows_of_every_reader(queue text) RETURNS bigint
LANGUAGE sql
AS $$
    SELECT (SELECT count(*) FROM dq_stats(queue))
        + (SELECT count(*) FROM dq_dead_stats(queue))
        + (SELECT count(*) FROM dq_schedules(queue))
        + (SELECT count(*) FROM dq_read_messages(queue, 1, 2))
        + (SELECT count(*) FROM dq_read_dead_letters(queue, 1, 2))
        + (SELECT count(*) FROM dq_read_bounds('messages', queue))
        + CASE WHEN dq_ack('00000000-0000-0000-0000-000000000000', queue) THEN 1 ELSE 0 END
$$;
SELECT lives_ok(
    'SELECT pg_temp.rows_of_every_reader(NULL)', 'a LANGUAGE sql function reads every queue through each reader'
);

-- a named queue is still checked
SELECT throws_ok(
    $$SELECT count(*) FROM dq_stats('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'dq_stats checks a named queue'
);
SELECT throws_ok(
    $$SELECT count(*) FROM dq_schedules('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'dq_schedules checks a named queue'
);
SELECT throws_ok(
    $$SELECT pg_temp.rows_of_every_reader('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'a named queue is checked from a LANGUAGE sql function too'
);
SELECT throws_ok(
    $$SELECT count(*) FROM dq_stats(repeat('q', 101))$$, '22023', NULL, 'dq_stats checks a long queue name'
);

SELECT * FROM finish();
ROLLBACK;
