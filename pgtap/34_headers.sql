-- Headers (1.2): a JSON object that travels with a message, taking no part
-- in the created / updated / ignored decision.
BEGIN;
SELECT plan(17);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT is(dq_offer('t_hdr', 'a', '1', NULL, TRUE, NULL, 0, '{"traceparent": "00-aa"}'), 'created', 'an offer with headers');
SELECT is((SELECT headers FROM dq_get('t_hdr', 'a')), '{"traceparent": "00-aa"}'::jsonb, 'dq_get shows them');
SELECT is((SELECT headers FROM dq_peek('t_hdr')), '{"traceparent": "00-aa"}'::jsonb, 'dq_peek shows them');
SELECT is(
    dq_offer('t_hdr', 'a', '1', NULL, TRUE, NULL, 0, '{"traceparent": "00-bb"}'), 'ignored',
    'the same offer with other headers is ignored'
);
SELECT is((SELECT headers FROM dq_get('t_hdr', 'a')), '{"traceparent": "00-aa"}'::jsonb, 'and keeps the old headers');
SELECT is(dq_offer('t_hdr', 'a', '2', NULL, TRUE, NULL, 0, '{"x": 1}'), 'updated', 'an update');
SELECT is((SELECT headers FROM dq_get('t_hdr', 'a')), '{"x": 1}'::jsonb, 'replaces the headers');
SELECT is(dq_offer('t_hdr', 'a', '3'), 'updated', 'an update without headers');
SELECT is((SELECT headers FROM dq_get('t_hdr', 'a')), NULL::jsonb, 'leaves none');

-- dq_offer_many: one per element, the last element that writes wins
SELECT results_eq(
    $$SELECT o.key, o.outcome FROM dq_offer_many(
        't_hdr', ARRAY['b', 'b', 'c', 'c'], ARRAY['1', '1', '1', '2']::jsonb[], NULL, TRUE, NULL, NULL,
        ARRAY['{"v": 1}', '{"v": 2}', '{"v": 3}', NULL]::jsonb[]
    ) AS o$$,
    $$VALUES ('b'::text, 'created'::text), ('b', 'ignored'), ('c', 'created'), ('c', 'updated')$$,
    'dq_offer_many decides as before'
);
SELECT results_eq(
    $$SELECT key, headers FROM dq_peek('t_hdr') WHERE key IN ('b', 'c') ORDER BY key$$,
    $$VALUES ('b'::text, '{"v": 1}'::jsonb), ('c', NULL)$$,
    'an ignored element keeps the headers, an updating one replaces them'
);
SELECT results_eq(
    $$SELECT o.outcome FROM dq_offer_many(
        't_hdr', ARRAY['b'], ARRAY['5']::jsonb[], NULL, TRUE, NULL, NULL, ARRAY['{"v": 9}']::jsonb[]
    ) AS o$$,
    $$VALUES ('updated'::text)$$,
    'a batch updating a stored message'
);
SELECT is((SELECT headers FROM dq_get('t_hdr', 'b')), '{"v": 9}'::jsonb, 'replaces its headers');

-- deliveries carry them
SELECT is(
    (
        SELECT d.headers FROM dq_poll_many('t_hdr', 10) AS d
        WHERE d.key = 'b'
    ), '{"v": 9}'::jsonb,
    'a delivery carries the headers'
);

-- errors
SELECT throws_ok(
    $$SELECT dq_offer('t_hdr', 'z', '1', NULL, TRUE, NULL, 0, '[1]')$$, '22023',
    'pgdq: headers must be a JSON object or NULL, got a JSON array', 'headers must be an object'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_hdr', ARRAY['y', 'z'], ARRAY['1', '1']::jsonb[], NULL, TRUE, NULL, NULL,
        ARRAY[NULL, '"s"']::jsonb[])$$, '22023',
    'pgdq: headers[2] must be a JSON object or NULL, got a JSON string', 'each element of headers must be one'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_hdr', ARRAY['y', 'z'], ARRAY['1', '1']::jsonb[], NULL, TRUE, NULL, NULL,
        ARRAY['{}']::jsonb[])$$, '22023',
    'pgdq: headers must be NULL or have as many elements as keys (2), got 1', 'headers as long as keys'
);

SELECT * FROM finish();
ROLLBACK;
