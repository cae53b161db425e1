-- dq_ack, dq_ack_many, dq_nack, dq_extend: current vs stale tokens, NULLs,
-- retry times, checkpoints, heartbeats; dq_ack_poll.
BEGIN;
SELECT plan(81);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT dq_offer_many('t_ack', ARRAY['a', 'b', 'c', 'd', 'e'], ARRAY['1', '2', '3', '4', '5']::jsonb[]);
CREATE TEMP TABLE d AS SELECT * FROM dq_poll_many('t_ack', 5, '1 minute');

-- ack
SELECT ok(dq_ack((
    SELECT lock_token FROM d
    WHERE key = 'a'
)), 'ack with the current token deletes');
SELECT is((SELECT count(*)::int FROM dq_get('t_ack', 'a')), 0, 'the message is gone');
SELECT ok(NOT dq_ack((
    SELECT lock_token FROM d
    WHERE key = 'a'
)), 'acking twice is harmless and false');
SELECT ok(NOT dq_ack(NULL), 'dq_ack(NULL) is false');
SELECT ok(NOT dq_ack(gen_random_uuid()), 'an unknown token is false');
SELECT ok(NOT dq_ack((
    '00000000-0000-' || lpad(to_hex((
        SELECT id FROM d
        WHERE key = 'b'
    )), 4, '0')
    || '-0000-000000000000'
)::uuid), 'a forged token with the right id is stale');

-- ack_many
SELECT is(dq_ack_many(ARRAY[
    (
        SELECT lock_token FROM d
        WHERE key = 'b'
    ), NULL,
    (
        SELECT lock_token FROM d
        WHERE key = 'c'
    ),
    (
        SELECT lock_token FROM d
        WHERE key = 'a'
    ),
    (
        SELECT lock_token FROM d
        WHERE key = 'b'
    )
]),
2, 'dq_ack_many counts current tokens once, ignores NULL and stale ones');
SELECT is(dq_ack_many(NULL), 0, 'dq_ack_many(NULL) is 0');
SELECT is(dq_ack_many('{}'), 0, 'dq_ack_many of nothing is 0');

-- a token whose lease expired but was not leased again is still valid
SELECT set_config('dq.now', '2024-01-01 10:05:00+00', TRUE);
SELECT ok(dq_ack((
    SELECT lock_token FROM d
    WHERE key = 'd'
)), 'an expired but not re-leased token still acks');

-- re-leased by another poll: the old token is stale
CREATE TEMP TABLE d2 AS SELECT * FROM dq_poll('t_ack', '1 minute');
SELECT is((SELECT key FROM d2), 'e', 'e is leased again after its lease expired');
SELECT ok(NOT dq_ack((
    SELECT lock_token FROM d
    WHERE key = 'e'
)), 'the previous token is stale once leased again');
SELECT ok(NOT dq_nack((
    SELECT lock_token FROM d
    WHERE key = 'e'
)), 'and cannot nack');
SELECT is(dq_extend((
    SELECT lock_token FROM d
    WHERE key = 'e'
), '1 minute'), NULL, 'and cannot extend');

-- extend
SELECT is(
    dq_extend((SELECT lock_token FROM d2), '10 minutes'), '2024-01-01 10:15:00+00'::timestamptz,
    'extend leases until now + lease and returns it'
);
SELECT is((SELECT due_at FROM dq_get('t_ack', 'e')), '2024-01-01 10:15:00+00'::timestamptz, 'the lease moved');
SELECT is(
    dq_extend((SELECT lock_token FROM d2), '1 second'), '2024-01-01 10:05:01+00'::timestamptz,
    'extend may shorten the lease'
);
SELECT is(dq_extend(NULL, '1 minute'), NULL, 'dq_extend(NULL, ...) is NULL');
SELECT throws_ok(
    format('SELECT dq_extend(%L, %L)', (SELECT lock_token FROM d2), '0 seconds'), '22023',
    'pgdq: lease must be positive, got 00:00:00', 'extend with a zero lease'
);
SELECT throws_ok(
    format('SELECT dq_extend(%L, NULL)', (SELECT lock_token FROM d2)), '22004',
    'pgdq: lease must not be NULL', 'extend with a NULL lease'
);
SELECT is((SELECT due_at FROM dq_get('t_ack', 'e')), '2024-01-01 10:05:01+00'::timestamptz, 'bad extends changed nothing');
SELECT ok(dq_ack((SELECT lock_token FROM d2)), 'the token stays valid across extends');

-- nack
SELECT dq_offer('t_nack', 'n', '{"v": 1}');
CREATE TEMP TABLE n1 AS SELECT * FROM dq_poll('t_nack', '1 minute');
SELECT ok(dq_nack((SELECT lock_token FROM n1), '2024-01-01 11:00:00+00', '{"step": 1}'), 'nack with a retry time and state');
SELECT ok(NOT dq_nack((SELECT lock_token FROM n1)), 'after a nack the token is stale');
SELECT ok(NOT dq_ack((SELECT lock_token FROM n1)), 'and cannot ack');
SELECT is((SELECT due_at FROM dq_get('t_nack', 'n')), '2024-01-01 11:00:00+00'::timestamptz, 'due at retry_at');
SELECT ok(NOT (SELECT leased FROM dq_get('t_nack', 'n')), 'no longer leased');
SELECT is((SELECT attempts FROM dq_get('t_nack', 'n')), 1, 'attempts are kept');
SELECT is((SELECT state FROM dq_get('t_nack', 'n')), '{"step": 1}'::jsonb, 'the state is stored');
SELECT is((SELECT scheduled_at FROM dq_get('t_nack', 'n')), '2024-01-01 10:05:00+00'::timestamptz, 'a nack does not move scheduled_at');
SELECT set_config('dq.now', '2024-01-01 11:00:00+00', TRUE);
CREATE TEMP TABLE n2 AS SELECT * FROM dq_poll('t_nack', '1 minute');
SELECT is((SELECT state FROM n2), '{"step": 1}'::jsonb, 'the next delivery carries the checkpoint');
SELECT ok(dq_nack((SELECT lock_token FROM n2)), 'nack without retry_at or state');
SELECT is((SELECT due_at FROM dq_get('t_nack', 'n')), '2024-01-01 11:00:00+00'::timestamptz, 'a NULL retry_at means now');
SELECT is((SELECT state FROM dq_get('t_nack', 'n')), '{"step": 1}'::jsonb, 'a NULL state keeps the checkpoint');
SELECT ok(NOT dq_nack(NULL), 'dq_nack(NULL) is false');
SELECT throws_ok(
    format('SELECT dq_nack(%L, %L)', (SELECT lock_token FROM n2), '-infinity'), '22023',
    'pgdq: retry_at must be a time in years 1 to 9999 UTC, got -infinity', 'an infinite retry_at is 22023'
);

-- cancelled while leased: the token is stale
CREATE TEMP TABLE n3 AS SELECT * FROM dq_poll('t_nack', '1 minute');
SELECT ok(dq_cancel('t_nack', 'n'), 'cancel a leased message');
SELECT ok(NOT dq_ack((SELECT lock_token FROM n3)), 'the token of a cancelled message is stale');

-- dq_ack_poll: the previous batch's acks ride on the next poll
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);
SELECT dq_offer_many('t_ap', ARRAY['p1', 'p2', 'p3', 'p4'], ARRAY['1', '2', '3', '4']::jsonb[]);
CREATE TEMP TABLE ap1 AS SELECT * FROM dq_ack_poll(NULL, 't_ap', 2, '1 minute');
SELECT is((SELECT array_agg(key ORDER BY key) FROM ap1), ARRAY['p1', 'p2'], 'with no tokens it is a plain poll');
CREATE TEMP TABLE ap2 AS
SELECT * FROM dq_ack_poll(array(SELECT lock_token FROM ap1) || gen_random_uuid(), 't_ap', 5, '1 minute');
SELECT is((SELECT array_agg(key ORDER BY key) FROM ap2), ARRAY['p3', 'p4'], 'it acks, then leases the next batch');
SELECT is((SELECT count(*)::int FROM dq_get('t_ap', 'p1')), 0, 'the acked messages are gone (unknown tokens ignored)');
SELECT ok((SELECT bool_and(attempts = 1 AND lease_until = '2024-01-01 12:01:00+00') FROM ap2), 'the new batch is leased');
SELECT throws_ok(
    $$SELECT * FROM dq_ack_poll(ARRAY(SELECT lock_token FROM ap2), 't_ap', 5, NULL)$$,
    '22004', NULL, 'a NULL lease is an error'
);
SELECT is((
    SELECT count(*)::int FROM dq_stats('t_ap')
    WHERE leased = 2
), 1, 'and the error undid its acks');
SELECT is(
    (SELECT count(*)::int FROM dq_ack_poll(array(SELECT lock_token FROM ap2), 't_ap', 0)), 0,
    'max_count 0 leases nothing'
);
SELECT is((
    SELECT count(*)::int FROM dq_stats('t_ap')
    WHERE ready + delayed + leased = 0
), 1, 'but it acks');

-- a lease must end after now, within the timestamp range (api-v1.1)
SELECT throws_ok(
    format('SELECT dq_extend(%L, %L)', (SELECT lock_token FROM d2), '300000 years'), '22023',
    'pgdq: lease 300000 years ends after year 9999 UTC', 'extend past the readable range'
);
SELECT set_config('dq.now', '2024-03-31 10:00:00+00', TRUE);
SELECT throws_ok(
    format('SELECT dq_extend(%L, %L)', (SELECT lock_token FROM d2), '1 mon -31 days'), '22023',
    NULL, 'extend with a lease that ends before now on this date'
);

-- dq_nack's error (1.1): kept as the message's last_error, the last 4,000
-- characters; a nack without one clears it; an offer that resets attempts
-- clears it; leases, extends and a stale nack keep it
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
SELECT dq_offer('t_err', 'e', '1');
CREATE TEMP TABLE e1 AS SELECT lock_token FROM dq_poll('t_err', '1 minute');
SELECT is(dq_nack((SELECT lock_token FROM e1), NULL, NULL, 'boom'), TRUE, 'a nack with an error');
SELECT is((SELECT last_error FROM dq_peek('t_err')), 'boom', 'the message keeps the error');
SELECT is(
    dq_nack((SELECT lock_token FROM e1), NULL, NULL, 'stale'), FALSE, 'a stale nack with an error: false'
);
SELECT is((SELECT last_error FROM dq_peek('t_err')), 'boom', 'and changes nothing');
CREATE TEMP TABLE e2 AS SELECT lock_token FROM dq_poll('t_err', '1 minute');
SELECT isnt(dq_extend((SELECT lock_token FROM e2), '2 minutes'), NULL, 'leased again and extended');
SELECT is((SELECT last_error FROM dq_peek('t_err')), 'boom', 'a lease and an extend keep last_error');
SELECT is(
    dq_nack(lock_token => (SELECT lock_token FROM e2), error => repeat('x', 4000) || 'tail'), TRUE,
    'a nack with an error of 4,004 characters (error by name)'
);
SELECT is(
    (SELECT last_error FROM dq_peek('t_err')), repeat('x', 3996) || 'tail',
    'only its last 4,000 characters are kept (a traceback ends with the exception)'
);
SELECT is(dq_nack((SELECT lock_token FROM dq_poll('t_err', '1 minute'))), TRUE, 'a nack without an error');
SELECT is((SELECT last_error FROM dq_peek('t_err')), NULL, 'clears last_error: it is the last nack''s error');
SELECT dq_nack((SELECT lock_token FROM dq_poll('t_err', '1 minute')), NULL, NULL, 'again');
SELECT is(dq_offer('t_err', 'e', '2'), 'updated', 'an offer updates the message');
SELECT results_eq(
    $$SELECT attempts, last_error FROM dq_peek('t_err')$$, $$VALUES (0, NULL::text)$$,
    'an update resets attempts and clears last_error'
);
SELECT dq_nack((SELECT lock_token FROM dq_poll('t_err', '1 minute')), NULL, NULL, 'batch');
SELECT is(
    (SELECT outcome FROM dq_offer_many('t_err', ARRAY['e'], ARRAY['3']::jsonb[])), 'updated',
    'a batch offer updates it'
);
SELECT is((SELECT last_error FROM dq_peek('t_err')), NULL, 'and clears last_error too');

-- tokens in their queue (1.2): given a queue, a token of another queue's
-- message is stale for every lock-token function, whatever its lease, and
-- that message is untouched; a NULL queue is any queue, as in 1.1
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
SELECT dq_offer_many('t_tq_b', ARRAY['b1', 'b2'], ARRAY['1', '2']::jsonb[]);
SELECT dq_channel_set('t_tq_b', 'limited', 1);
SELECT dq_offer('t_tq_b', 'b3', '3', NULL, TRUE, 'limited');
SELECT dq_offer('t_tq_a', 'a1', '1');
CREATE TEMP TABLE tq AS
SELECT
    key,
    lock_token
FROM dq_poll_many('t_tq_b', 3, '1 minute');
CREATE TEMP TABLE tq_a AS
SELECT lock_token FROM dq_poll('t_tq_a', '1 minute');
CREATE FUNCTION pg_temp.tq(k text) RETURNS uuid LANGUAGE sql AS $$
    SELECT lock_token FROM tq
    WHERE key = k
$$;
CREATE TEMP TABLE tq_before AS
SELECT
    key,
    lock_token,
    due_at,
    attempts,
    state,
    last_error
FROM dq_messages
WHERE queue = 't_tq_b';
SELECT is((
    SELECT count(*)::int FROM tq_before
    WHERE lock_token IS NOT NULL
), 3, 'three messages of t_tq_b leased');
SELECT ok(NOT dq_ack(pg_temp.tq('b1'), 't_tq_a'), 'dq_ack of a token of t_tq_b, given t_tq_a: stale');
SELECT is(
    dq_ack_many(ARRAY[pg_temp.tq('b1'), pg_temp.tq('b2'), pg_temp.tq('b3')], 't_tq_a'), 0,
    'dq_ack_many counts none of them'
);
SELECT ok(
    NOT dq_nack(pg_temp.tq('b1'), '2024-01-01 11:00:00+00', '{"x": 1}', 'boom', 't_tq_a'),
    'dq_nack: stale'
);
SELECT is(dq_extend(pg_temp.tq('b1'), '1 hour', 't_tq_a'), NULL, 'dq_extend: stale');
SELECT is(dq_extend(pg_temp.tq('b3'), '1 hour', 't_tq_a'), NULL, 'dq_extend of a channel''s message: stale');
SELECT set_config('dq.now', '2024-01-01 10:05:00+00', TRUE);
SELECT ok(NOT dq_ack(pg_temp.tq('b2'), 't_tq_a'), 'stale even after the lease ended (not leased again)');
SELECT is(dq_extend(pg_temp.tq('b3'), '1 hour', 't_tq_a'), NULL, 'and dq_extend of the ended lease too');
SELECT results_eq(
    $$SELECT key, lock_token, due_at, attempts, state, last_error FROM dq_messages
    WHERE queue = 't_tq_b' ORDER BY key$$,
    $$SELECT * FROM tq_before ORDER BY key$$,
    'the messages of t_tq_b are untouched: same tokens, due times, attempts, state, last_error'
);
SELECT is(
    dq_ack_many(ARRAY[pg_temp.tq('b1'), (SELECT lock_token FROM tq_a)], 't_tq_a'), 1,
    'a batch with a token of each queue acks only the given queue''s'
);
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_tq_b'
), 3, 'and t_tq_b keeps its messages');
SELECT isnt(dq_extend(pg_temp.tq('b1'), '1 minute', 't_tq_b'), NULL, 'given its own queue, a token extends');
SELECT ok(dq_nack(pg_temp.tq('b1'), NULL, NULL, NULL, 't_tq_b'), 'and nacks');
SELECT is(dq_ack_many(ARRAY[pg_temp.tq('b2')], 't_tq_b'), 1, 'and acks in a batch');
SELECT ok(dq_ack(pg_temp.tq('b3'), NULL), 'a NULL queue acks a token of any queue (1.1)');
SELECT throws_ok(
    format('SELECT dq_ack(%L, %L)', gen_random_uuid(), ''), '22023',
    'pgdq: queue must be 1 to 100 characters long, got 0', 'dq_ack: an empty queue is 22023'
);
SELECT throws_ok(
    format('SELECT dq_ack_many(ARRAY[%L]::uuid[], %L)', gen_random_uuid(), repeat('q', 101)), '22023',
    'pgdq: queue must be 1 to 100 characters long, got 101', 'dq_ack_many: a queue too long is 22023'
);
SELECT throws_ok(
    format('SELECT dq_nack(%L, NULL, NULL, NULL, %L)', gen_random_uuid(), ''), '22023',
    'pgdq: queue must be 1 to 100 characters long, got 0', 'dq_nack: 22023'
);
SELECT throws_ok(
    format('SELECT dq_extend(%L, %L, %L)', gen_random_uuid(), '1 minute', ''), '22023',
    'pgdq: queue must be 1 to 100 characters long, got 0', 'dq_extend: 22023'
);

SELECT * FROM finish();
ROLLBACK;
