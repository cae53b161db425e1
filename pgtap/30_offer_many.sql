-- dq_offer_many: per-element outcomes in input order, repeated keys, NULL
-- times, 100,000 elements, bad input writes nothing.
BEGIN;
SELECT plan(25);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT results_eq(
    $$SELECT key, outcome FROM dq_offer_many('t_many', ARRAY['a', 'b', 'c'], ARRAY['1', '2', '3']::jsonb[])$$,
    $$VALUES ('a', 'created'), ('b', 'created'), ('c', 'created')$$,
    'one row per element, in input order'
);
SELECT results_eq(
    $$SELECT key, outcome FROM dq_offer_many('t_many', ARRAY['c', 'x', 'a', 'b'], ARRAY['3', '9', '1', '5']::jsonb[])$$,
    $$VALUES ('c', 'ignored'), ('x', 'created'), ('a', 'ignored'), ('b', 'updated')$$,
    'existing keys are ignored or updated like dq_offer'
);
SELECT results_eq(
    $$SELECT key, outcome FROM dq_offer_many('t_many', ARRAY['r', 'r', 'r', 'r'], ARRAY['1', '1', '2', '2']::jsonb[])$$,
    $$VALUES ('r', 'created'), ('r', 'ignored'), ('r', 'updated'), ('r', 'ignored')$$,
    'a repeated key is created once, then updated or ignored in array order'
);
SELECT is((SELECT payload FROM dq_get('t_many', 'r')), '2'::jsonb, 'the last version wins');
SELECT results_eq(
    $$SELECT outcome FROM dq_offer_many('t_many', ARRAY['s', 's', 's'], ARRAY['1', '1', '1']::jsonb[],
        ARRAY['2024-01-01 11:00+00', NULL, '2024-01-01 12:00+00']::timestamptz[])$$,
    $$VALUES ('created'), ('ignored'), ('updated')$$,
    'a NULL time element matches the previous element''s time'
);
SELECT is((SELECT scheduled_at FROM dq_get('t_many', 's')), '2024-01-01 12:00+00'::timestamptz, 'the last time wins');
SELECT results_eq(
    $$SELECT outcome FROM dq_offer_many('t_many', ARRAY['s', 's'], ARRAY['2', '2']::jsonb[])$$,
    $$VALUES ('updated'), ('ignored')$$,
    'an update without a time makes it due now; repeating it is ignored'
);
SELECT is((SELECT scheduled_at FROM dq_get('t_many', 's')), '2024-01-01 10:00+00'::timestamptz, 'due now after the update');
SELECT results_eq(
    $$SELECT outcome FROM dq_offer_many('t_many', ARRAY['n', 'n', 'a'], ARRAY['1', '2', '7']::jsonb[], NULL, false)$$,
    $$VALUES ('created'), ('ignored'), ('ignored')$$,
    'can_update false: created once, everything else ignored'
);
SELECT is((SELECT payload FROM dq_get('t_many', 'n')), '1'::jsonb, 'can_update false keeps the first version');
SELECT is((SELECT count(*)::int FROM dq_offer_many('t_many', '{}', '{}')), 0, 'empty arrays: no rows');


-- 100,000 elements in one call
SELECT is(
    (SELECT count(
        *
    )::int FROM
        dq_offer_many(
            't_big',
            array(SELECT 'k' || i FROM generate_series(1, 100000) AS i),
            array(SELECT to_jsonb(i) FROM generate_series(1, 100000) AS i)
        )
    WHERE outcome = 'created'),
    100000, '100,000 elements in one call are all created'
);
SELECT is((SELECT ready FROM dq_stats('t_big')), 100000::bigint, 'and stored');

-- bad input: clear errors, nothing written
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a', 'b'], ARRAY['1']::jsonb[])$$, '22023',
    'pgdq: keys, payloads and scheduled_ats must have equal lengths, got 2, 1 and NULL', 'arrays of different lengths'
);
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a'], ARRAY['1']::jsonb[], ARRAY[NULL, NULL]::timestamptz[])$$, '22023',
    'pgdq: keys, payloads and scheduled_ats must have equal lengths, got 1, 1 and 2', 'scheduled_ats of another length'
);
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a', NULL], ARRAY['1', '2']::jsonb[])$$, '22004',
    'pgdq: keys[2] must not be NULL', 'a NULL key element'
);
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a', 'b'], ARRAY['1', NULL]::jsonb[])$$, '22004',
    'pgdq: payloads[2] must not be NULL', 'a NULL payload element'
);
SELECT throws_ok($$SELECT dq_offer_many('t_bad', NULL, ARRAY['1']::jsonb[])$$, '22004', 'pgdq: keys must not be NULL', 'NULL keys');
SELECT throws_ok($$SELECT dq_offer_many('t_bad', ARRAY['a'], NULL)$$, '22004', 'pgdq: payloads must not be NULL', 'NULL payloads');
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a', ''], ARRAY['1', '2']::jsonb[])$$, '22023',
    'pgdq: keys[2] must be 1 to 200 characters long, got 0', 'an empty key element'
);
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', ARRAY['a'], ARRAY['1']::jsonb[], NULL, NULL)$$, '22004',
    'pgdq: can_update must not be NULL', 'NULL can_update'
);
SELECT throws_ok(
    $$SELECT dq_offer_many(NULL, ARRAY['a'], ARRAY['1']::jsonb[])$$, '22004',
    'pgdq: queue must not be NULL', 'NULL queue'
);
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_bad'
), 0, 'bad batches wrote nothing');

-- infinite times (api-v1.1)
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_many_inf', ARRAY['a', 'b'], ARRAY['1', '2']::jsonb[], ARRAY[now(), 'infinity'])$$, '22023',
    'pgdq: scheduled_ats[2] must be a time in years 1 to 9999 UTC, got infinity', 'an infinite element is 22023 naming it'
);
SELECT is((
    SELECT count(*)::int FROM dq_stats('t_many_inf')
    WHERE ready + delayed > 0
), 0, 'and nothing was written');

SELECT * FROM finish();
ROLLBACK;
