-- dq_browse and dq_run_now (1.2, the dashboard's): a page of messages at a
-- time with a key prefix, and a delayed message made due now.
BEGIN;
SELECT plan(14);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT dq_offer('t_br', 'order-' || i, to_jsonb(i), '2024-01-01 10:00+00'::timestamptz + make_interval(mins => i))
FROM generate_series(1, 12) AS g (i);
SELECT dq_offer('t_br', 'user-1', '0', '2024-01-01 09:00+00', TRUE, 'ch', 2, '{"h": 1}');
SELECT dq_send('t_br', '"keyless"', '2024-01-01 10:00:30+00');
SELECT dq_offer('t_br_other', 'order-1', '1');

SELECT results_eq(
    $$SELECT key FROM dq_browse('t_br', NULL, NULL, NULL, NULL, 4)$$,
    $$VALUES ('user-1'::text), (NULL), ('order-1'), ('order-2')$$,
    'the first page: by due time, every kind of message'
);
SELECT results_eq(
    $$SELECT b.key FROM dq_browse(
        't_br', NULL, NULL, '2024-01-01 10:02+00',
        (SELECT m.id FROM dq_messages AS m WHERE m.queue = 't_br' AND m.key = 'order-2'), 3
    ) AS b$$,
    $$VALUES ('order-3'::text), ('order-4'), ('order-5')$$,
    'the next page starts after the last row of the page before'
);
SELECT results_eq(
    $$SELECT key FROM dq_browse('t_br', NULL, 'order-1', NULL, NULL, 10)$$,
    $$VALUES ('order-1'::text), ('order-10'), ('order-11'), ('order-12')$$,
    'a key prefix: only its keys, by due time'
);
SELECT is((SELECT count(*)::int FROM dq_browse('t_br', NULL, 'nope')), 0, 'a prefix no key has');
SELECT is(
    (
        SELECT count(*)::int FROM dq_browse(
            't_br', NULL, 'order-1', '2024-01-01 10:10+00',
            (
                SELECT m.id FROM dq_messages AS m
                WHERE m.queue = 't_br' AND m.key = 'order-10'
            ), 10
        )
    ), 2,
    'a prefix, paged'
);
SELECT results_eq(
    $$SELECT key, headers FROM dq_browse('t_br', 'due')$$,
    $$VALUES ('user-1'::text, '{"h": 1}'::jsonb)$$,
    'which: due only, with headers'
);
SELECT is(
    (SELECT count(*)::int FROM dq_browse('t_br', NULL, 'order-1%')), 0, 'a prefix is literal: % matches itself'
);

-- run now
SELECT is(dq_run_now('t_br', (
    SELECT id FROM dq_messages
    WHERE queue = 't_br' AND key = 'order-12'
)), TRUE, 'run now: a delayed message');
SELECT is((SELECT due_at FROM dq_get('t_br', 'order-12')), '2024-01-01 10:00+00'::timestamptz, 'is due now');
SELECT is((SELECT scheduled_at FROM dq_get('t_br', 'order-12')), '2024-01-01 10:12+00'::timestamptz, 'its scheduled_at stays');
SELECT is(dq_run_now('t_br', (
    SELECT id FROM dq_messages
    WHERE queue = 't_br' AND key = 'order-12'
)), FALSE, 'a due message: false');
SELECT is(dq_run_now('t_br', (
    SELECT id FROM dq_messages
    WHERE queue = 't_br_other'
)), FALSE, 'another queue''s id: false');
SELECT throws_ok($$SELECT dq_run_now('t_br', NULL)$$, '22004', 'pgdq: id must not be NULL', 'dq_run_now: NULL id');
SELECT throws_ok(
    $$SELECT * FROM dq_browse('t_br', NULL, '')$$, '22023', NULL, 'dq_browse: an empty prefix'
);

SELECT * FROM finish();
ROLLBACK;
