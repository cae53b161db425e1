-- dq_offer: created / updated / ignored, times, ids, resets, bad input.
BEGIN;
SELECT plan(53);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- created, with a NULL time meaning now
SELECT is(dq_offer('t_offer', 'a', '{"n": 1}'), 'created', 'a new key is created');
SELECT is(
    (SELECT scheduled_at FROM dq_get('t_offer', 'a')), '2024-01-01 10:00:00+00'::timestamptz,
    'a NULL scheduled_at means now for a new message'
);
SELECT is(
    (SELECT created_at FROM dq_get('t_offer', 'a')), '2024-01-01 10:00:00+00'::timestamptz,
    'created_at is the offer time'
);

-- ignored when nothing changes
SELECT is(dq_offer('t_offer', 'a', '{"n": 1}'), 'ignored', 'same payload, no time: ignored');
SELECT is(
    dq_offer('t_offer', 'a', '{"n": 1}', '2024-01-01 10:00:00+00'), 'ignored',
    'same payload, same time: ignored'
);
SELECT is(dq_offer('t_offer', 'a', '{"n":1}'::jsonb), 'ignored', 'payload equality is jsonb equality');

-- updated when payload or time changes
SELECT is(dq_offer('t_offer', 'b', '{"n": 1}', '2024-01-01 11:00:00+00'), 'created', 'created for later');
SELECT is(
    dq_offer('t_offer', 'b', '{"n": 1}'), 'ignored',
    'a NULL time matches whatever time the message was offered for'
);
SELECT is(dq_offer('t_offer', 'b', '{"n": 1}', '2024-01-01 12:00:00+00'), 'updated', 'another time: updated');
SELECT is(
    (SELECT due_at FROM dq_get('t_offer', 'b')), '2024-01-01 12:00:00+00'::timestamptz,
    'the update moved the due time'
);
SELECT is(dq_offer('t_offer', 'b', '{"n": 2}'), 'updated', 'another payload without a time: updated');
SELECT is(
    (SELECT scheduled_at FROM dq_get('t_offer', 'b')), '2024-01-01 10:00:00+00'::timestamptz,
    'an update with a NULL time makes it due now'
);
SELECT is((SELECT payload FROM dq_get('t_offer', 'b')), '{"n": 2}'::jsonb, 'the update replaced the payload');

-- can_update false: ignored whatever the state
SELECT is(dq_offer('t_offer', 'c', '1', '2024-01-01 11:00:00+00', FALSE), 'created', 'can_update false still creates');
SELECT is(dq_offer('t_offer', 'c', '2', NULL, FALSE), 'ignored', 'can_update false: delayed message ignored');
SELECT is(dq_offer('t_offer', 'a', '2', NULL, FALSE), 'ignored', 'can_update false: due message ignored');
SELECT is((SELECT payload FROM dq_get('t_offer', 'c')), '1'::jsonb, 'an ignored offer changed nothing');

-- a past time is allowed and due at once
SELECT is(dq_offer('t_offer', 'past', '1', '2023-12-31 00:00:00+00'), 'created', 'a past time is allowed');
SELECT is((SELECT key FROM dq_poll('t_offer')), 'past', 'a past message is due at once (and first)');

-- updating a leased message: ids stay, attempts/state/lease reset, old token stale
SELECT dq_purge('t_offer');
SELECT dq_offer('t_offer', 'l', '1');
CREATE TEMP TABLE d1 AS SELECT * FROM dq_poll('t_offer', '1 minute');
SELECT is(dq_offer('t_offer', 'l', '1', NULL, FALSE), 'ignored', 'can_update false: leased message ignored');
SELECT is(dq_offer('t_offer', 'l', '1'), 'ignored', 'same version of a leased message: ignored');
SELECT ok((SELECT leased FROM dq_get('t_offer', 'l')), 'an ignored offer keeps the lease');
SELECT ok(dq_nack((SELECT lock_token FROM d1), NULL, '{"step": 1}'), 'nack with a checkpoint');
CREATE TEMP TABLE d2 AS SELECT * FROM dq_poll('t_offer', '1 minute');
SELECT is((SELECT id FROM d2), (SELECT id FROM d1), 'the id is stable across nack and redelivery');
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT is(dq_offer('t_offer', 'l', '2'), 'updated', 'a leased message can be updated');
SELECT is(
    (
        SELECT id FROM dq_messages
        WHERE queue = 't_offer' AND key = 'l'
    ), (SELECT id FROM d1
    ),
    'the id is stable across updates'
);
SELECT is((SELECT attempts FROM dq_get('t_offer', 'l')), 0, 'an update resets attempts');
SELECT is((SELECT state FROM dq_get('t_offer', 'l')), NULL, 'an update clears the state');
SELECT ok(NOT (SELECT leased FROM dq_get('t_offer', 'l')), 'an update drops the lease');
SELECT is(
    (SELECT created_at FROM dq_get('t_offer', 'l')), '2024-01-01 10:00:30+00'::timestamptz,
    'created_at is the time of this version'
);
SELECT ok(NOT dq_ack((SELECT lock_token FROM d2)), 'the old token cannot ack');
SELECT ok(NOT dq_nack((SELECT lock_token FROM d2)), 'the old token cannot nack');
SELECT is(dq_extend((SELECT lock_token FROM d2), '1 minute'), NULL, 'the old token cannot extend');

-- names are literal text; JSON null is a payload
SELECT is(dq_offer('t_%_offer', '.*''; --', 'null'), 'created', 'any characters in names, JSON null payload');
SELECT is((SELECT payload FROM dq_get('t_%_offer', '.*''; --')), 'null'::jsonb, 'stored as given');
SELECT is((
    SELECT count(*)::int FROM dq_stats()
    WHERE queue LIKE 't\_\%\_offer'
), 1, 'the % queue is its own queue');

-- bad input: clear errors, nothing written
SELECT throws_ok($$SELECT dq_offer(NULL, 'k', '1')$$, '22004', 'pgdq: queue must not be NULL', 'NULL queue');
SELECT throws_ok($$SELECT dq_offer('', 'k', '1')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0', 'empty queue');
SELECT throws_ok(
    $$SELECT dq_offer(repeat('q', 101), 'k', '1')$$, '22023',
    'pgdq: queue must be 1 to 100 characters long, got 101', 'queue too long'
);
SELECT throws_ok(
    $$SELECT dq_offer('t_bad', repeat('k', 201), '1')$$, '22023',
    'pgdq: key must be 1 to 200 characters long, got 201', 'key too long'
);
SELECT throws_ok($$SELECT dq_offer('t_bad', NULL, '1')$$, '22004', 'pgdq: key must not be NULL', 'NULL key');
SELECT throws_ok($$SELECT dq_offer('t_bad', 'k', NULL)$$, '22004', 'pgdq: payload must not be NULL', 'NULL payload');
SELECT throws_ok($$SELECT dq_offer('t_bad', 'k', '1', NULL, NULL)$$, '22004', 'pgdq: can_update must not be NULL', 'NULL can_update');
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_bad'
), 0, 'bad offers wrote nothing');
SELECT is(dq_offer(repeat('q', 100), repeat('k', 200), '1'), 'created', '100-character queue and 200-character key are fine');

-- infinite times (api-v1.1)
SELECT throws_ok(
    $$SELECT dq_offer('t_offer', 'inf', '1', 'infinity')$$, '22023',
    'pgdq: scheduled_at must be a time in years 1 to 9999 UTC, got infinity', 'an infinite scheduled_at is 22023'
);
SELECT throws_ok(
    $$SELECT dq_offer('t_offer', 'inf', '1', '-infinity')$$, '22023',
    'pgdq: scheduled_at must be a time in years 1 to 9999 UTC, got -infinity', 'so is -infinity'
);
SELECT is((SELECT count(*)::int FROM dq_get('t_offer', 'inf')), 0, 'and nothing was written');

-- 1.3: an offer of a new key is one plain insert that counts itself: no
-- count trigger runs for it; an update is counted by the update trigger
SET LOCAL track_functions = 'pl';
CREATE FUNCTION pg_temp.count_trigger_runs() RETURNS int LANGUAGE sql AS $$
    SELECT coalesce(sum(f.calls), 0)::int
    FROM pg_stat_xact_user_functions AS f
    WHERE f.funcname IN ('dq__count_rows', 'dq__count_updated')
$$;
CREATE TEMP TABLE trigger_calls AS SELECT pg_temp.count_trigger_runs() AS calls;
SELECT is(dq_offer('t_offer', 'fresh', '1'), 'created', 'an offer of a new key');
SELECT is(
    pg_temp.count_trigger_runs() - (SELECT t.calls FROM trigger_calls AS t), 0,
    'runs no count trigger (1.3)'
);
SELECT is(dq_offer('t_offer', 'fresh', '2'), 'updated', 'an update of it');
SELECT is(
    pg_temp.count_trigger_runs() - (SELECT t.calls FROM trigger_calls AS t), 1,
    'is counted by the update trigger'
);
SELECT ok(
    array(
        SELECT row(c.*)::text FROM dq__counted_stats(dq_now()) AS c
        WHERE c.queue = 't_offer'
    ) = array(
        SELECT row(s.*)::text FROM dq__scanned_stats(dq_now()) AS s
        WHERE s.queue = 't_offer'
    ),
    'and the counts agree with the messages'
);
RESET track_functions;

SELECT * FROM finish();
ROLLBACK;
