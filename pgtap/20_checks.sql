-- One checker per argument rule (sql/src/20_checks.sql): the key rule's
-- limit is written once and every function taking a key says the same; one
-- naming convention for parameters; the generic range and choice checks.
BEGIN;
SELECT plan(13);

-- pgdq's own functions (an extension or a plain install)
CREATE TEMP TABLE ours AS
SELECT
    p.proname::text AS fn,
    p.prosrc,
    p.proargnames
FROM pg_proc AS p
INNER JOIN pg_type AS t ON p.pronamespace = t.typnamespace
WHERE t.oid = 'dq_delivery'::regtype AND p.proname LIKE 'dq\_%';

SELECT is(
    (
        SELECT array_agg(o.fn ORDER BY o.fn) FROM ours AS o
        WHERE o.prosrc ~ '\m200\M'
    ),
    ARRAY['dq__key_max_length'], 'the key limit, 200, is written in one function'
);
SELECT is(
    (
        SELECT array_agg(DISTINCT o.fn ORDER BY o.fn) FROM ours AS o
        CROSS JOIN LATERAL unnest(o.proargnames) AS a (arg)
        WHERE a.arg ~ '^[a-z]_'
    ),
    NULL, 'no parameter or result column has a prefix such as p_ or o_ (they carry API names)'
);

-- the key rule, worded the same by every function that takes a key
CREATE TEMP TABLE key_calls (call text);
INSERT INTO key_calls VALUES
('SELECT dq_offer(''t_chk'', %L, ''1'')'),
('SELECT dq_cancel(''t_chk'', %L)'),
('SELECT * FROM dq_get(''t_chk'', %L)'),
('SELECT dq_dead_redrive(''t_chk'', %L)'),
('SELECT dq_dead_purge(''t_chk'', %L)');
SELECT
    throws_ok(
        format(k.call, repeat('k', 201)), '22023', 'pgdq: key must be 1 to 200 characters long, got 201',
        split_part(k.call, '(', 1) || ': a key of 201 characters'
    )
FROM key_calls AS k;
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_chk', ARRAY['a', repeat('k', 201)], ARRAY['1', '2']::jsonb[])$$, '22023',
    'pgdq: keys[2] must be 1 to 200 characters long, got 201', 'dq_offer_many names the element'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_chk', ARRAY['a', ''], ARRAY['1', '2']::jsonb[])$$, '22023',
    'pgdq: keys[2] must be 1 to 200 characters long, got 0', 'an empty key element too'
);
SELECT lives_ok(
    format('SELECT dq_offer(%L, %L, %L)', 't_chk', repeat('k', 200), '1'), 'a key of 200 characters is fine'
);

-- the generic checks
SELECT throws_ok(
    $$SELECT dq_schedule_set('t_chk', 's', '* * * * *', 'UTC', '{}', 101)$$, '22023',
    'pgdq: max_missed must be 1 to 100, got 101', 'a range: max_missed'
);
SELECT throws_ok(
    $$SELECT dq_schedule_set('t_chk', 's', '* * * * *', 'UTC', '{}', NULL)$$, '22004',
    'pgdq: max_missed must not be NULL', 'a range: NULL'
);
SELECT throws_ok(
    $$SELECT dq_schedule_set('t_chk', 'a/b', '* * * * *')$$, '22023',
    'pgdq: name must not contain "/"', 'a schedule name follows the key prefix rule'
);

SELECT * FROM finish();
ROLLBACK;
