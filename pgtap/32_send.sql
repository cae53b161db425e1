-- Keyless messages (1.2): dq_send, dq_send_many, and the by-id functions.
-- A keyless message is never deduplicated, has key NULL in every result, no
-- entry in the key index, and lives, fails and comes back like any other.
BEGIN;
SELECT plan(59);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- sending
SELECT ok(dq_send('t_send', '{"n": 1}') > 0, 'dq_send returns the new message''s id');
SELECT ok(dq_send('t_send', '{"n": 1}') > 0, 'the same payload again is another message');
SELECT is((SELECT count(*)::int FROM dq_peek('t_send')), 2, 'never deduplicated');
SELECT is(
    (SELECT array_agg(DISTINCT key) FROM dq_peek('t_send')), ARRAY[NULL::text], 'key NULL in dq_peek'
);
CREATE TEMP TABLE sent AS
SELECT
    row_number() OVER () AS ord,
    s.id
FROM dq_send_many('t_send', ARRAY['"a"', '"b"', '"c"']::jsonb[], ARRAY[NULL, '2024-01-01 11:00+00', NULL]::timestamptz[])
    AS s (id);
SELECT is((SELECT count(*)::int FROM sent), 3, 'dq_send_many returns one id per element');
SELECT ok(
    (SELECT bool_and(s.id > p.id) FROM sent AS s INNER JOIN sent AS p ON p.ord = s.ord - 1),
    'the ids, ascending, in input order'
);
SELECT results_eq(
    $$SELECT g.payload, g.scheduled_at FROM sent AS s, dq_get_id('t_send', s.id) AS g ORDER BY s.ord$$,
    $$VALUES ('"a"'::jsonb, '2024-01-01 10:00+00'::timestamptz), ('"b"', '2024-01-01 11:00+00'), ('"c"', '2024-01-01 10:00+00')$$,
    'each id is its element''s message; a NULL time means now'
);
SELECT is((
    SELECT g.key FROM sent AS s, dq_get_id('t_send', s.id) AS g
    WHERE s.ord = 1
), NULL, 'dq_get_id: key NULL');
SELECT is(
    (SELECT count(*)::int FROM dq_send_many('t_send', '{}'::jsonb[])), 0, 'an empty batch sends nothing'
);
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_send' AND key IS NULL
    ), 5,
    'five keyless messages stored'
);

-- keyed and keyless side by side: a key is still unique
SELECT is(dq_offer('t_send', 'k', '1'), 'created', 'a keyed offer beside keyless messages');
SELECT is(dq_offer('t_send', 'k', '1'), 'ignored', 'is still deduplicated');

-- consuming: delivered, leased, acked like any other, in due order
CREATE TEMP TABLE first_batch AS SELECT * FROM dq_poll_many('t_send', 10, '1 minute');
SELECT results_eq(
    $$SELECT key, payload FROM first_batch$$,
    $$VALUES (NULL::text, '{"n": 1}'::jsonb), (NULL, '{"n": 1}'), (NULL, '"a"'), (NULL, '"c"'), ('k', '1')$$,
    'a poll delivers keyless messages with key NULL, due first, ties by id'
);
SELECT set_config('dq.now', '2024-01-01 10:30:00+00', TRUE);
CREATE TEMP TABLE got AS SELECT * FROM dq_poll('t_send', '1 minute');
SELECT is(
    (SELECT row(payload, redelivery)::text FROM got), row('{"n": 1}'::jsonb, TRUE)::text,
    'an expired lease of a keyless message is delivered again'
);
SELECT is(dq_ack_many(array(SELECT lock_token FROM first_batch), 't_send'), 4, 'acked but the one redelivered');
SELECT ok(dq_ack((SELECT lock_token FROM got)), 'and that one by its new token');
SELECT set_config('dq.now', '2024-01-01 11:00:00+00', TRUE);
DELETE FROM got;
INSERT INTO got SELECT * FROM dq_poll('t_send', '1 minute');
SELECT is((SELECT payload FROM got), '"b"'::jsonb, 'the delayed one when it is due');
SELECT isnt(dq_extend((SELECT lock_token FROM got), '5 minutes'), NULL, 'extended');
SELECT ok(dq_nack((SELECT lock_token FROM got), '2024-01-01 11:00:00+00', '{"tried": 1}', 'boom'), 'nacked');
SELECT is(
    (SELECT row(g.state, g.attempts)::text FROM dq_get_id('t_send', (SELECT id FROM got)) AS g),
    row('{"tried": 1}'::jsonb, 1)::text,
    'a nack keeps its state and attempts'
);
DELETE FROM got;
INSERT INTO got SELECT * FROM dq_poll('t_send', '1 minute');
SELECT ok(dq_ack((SELECT lock_token FROM got), 't_send'), 'acked');
SELECT is((SELECT count(*)::int FROM dq_get_id('t_send', (SELECT id FROM got))), 0, 'gone once acked');

-- dq_cancel_id and dq_get_id of other queues
CREATE TEMP TABLE two AS SELECT s.id FROM dq_send_many('t_send', ARRAY['1', '2']::jsonb[]) AS s (id);
SELECT count(*) FROM dq_poll('t_send');
SELECT ok(dq_cancel_id('t_send', (SELECT min(id) FROM two)), 'dq_cancel_id deletes a message, leased or not');
SELECT ok(NOT dq_cancel_id('t_send', (SELECT min(id) FROM two)), 'and is false the second time');
SELECT ok(NOT dq_cancel_id('t_other', (SELECT max(id) FROM two)), 'false for another queue''s message');
SELECT is(
    (SELECT count(*)::int FROM dq_get_id('t_other', (SELECT max(id) FROM two))), 0,
    'dq_get_id does not read another queue''s message'
);
SELECT is(
    (SELECT count(*)::int FROM dq_get_id('t_send', (SELECT max(id) FROM two))), 1,
    'the message is still there'
);
SELECT dq_offer('t_send', 'k', '2');
SELECT is(
    (SELECT key FROM dq_get_id('t_send', (
        SELECT m.id FROM dq_messages AS m
        WHERE m.key = 'k'
    ))), 'k',
    'dq_get_id reads keyed messages too'
);

-- dead letters: one per keyless message, redriven and purged by id
SELECT dq_purge('t_send');
SELECT dq_configure('t_dead', 1);
CREATE TEMP TABLE dead_ids AS SELECT s.id FROM dq_send_many('t_dead', ARRAY['1', '2', '3']::jsonb[]) AS s (id);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_dead', 10, '1 minute')), 3, 'three keyless deliveries');
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_dead', 10)), 0, 'their leases expired: buried by the next poll');
SELECT results_eq(
    $$SELECT key, id, payload FROM dq_dead_list('t_dead')$$,
    $$SELECT NULL::text, d.id, to_jsonb(row_number() OVER (ORDER BY d.id)) FROM dead_ids AS d ORDER BY d.id$$,
    'one dead letter each, key NULL, carrying the message''s id'
);
SELECT is((SELECT dead FROM dq_dead_stats('t_dead')), 3::bigint, 'dq_dead_stats counts them');
CREATE TEMP TABLE redriven AS SELECT dq_dead_redrive_id('t_dead', (SELECT min(id) FROM dead_ids)) AS id;
SELECT ok((SELECT id FROM redriven) > (SELECT max(id) FROM dead_ids), 'dq_dead_redrive_id returns the new message''s id');
SELECT is(
    (SELECT row(g.payload, g.attempts, g.key)::text FROM dq_get_id('t_dead', (SELECT id FROM redriven)) AS g),
    row('1'::jsonb, 0, NULL::text)::text,
    'which is fresh, keyless, with the dead letter''s payload'
);
SELECT is(dq_dead_redrive_id('t_dead', (SELECT min(id) FROM dead_ids)), NULL, 'NULL: that dead letter is gone');
SELECT is(dq_dead_redrive_id('t_other', (SELECT max(id) FROM dead_ids)), NULL, 'NULL for another queue''s dead letter');
SELECT is(dq_dead_purge_id('t_dead', (SELECT max(id) FROM dead_ids)), 1::bigint, 'dq_dead_purge_id deletes one');
SELECT is(dq_dead_purge_id('t_dead', (SELECT max(id) FROM dead_ids)), 0::bigint, 'and nothing the second time');
SELECT is(dq_dead_redrive('t_dead'), 1, 'dq_dead_redrive brings back the keyless rest');
SELECT is((SELECT count(*)::int FROM dq_dead_list('t_dead')), 0, 'no dead letters left');
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_dead' AND key IS NULL
    ), 2,
    'two keyless messages live again'
);
-- keyed dead letters by id follow the keyed rules
SELECT dq_offer('t_dead', 'kk', '"keyed"');
SELECT count(*) FROM dq_poll_many('t_dead', 10, '1 minute');
SELECT set_config('dq.now', '2024-01-01 13:00:00+00', TRUE);
SELECT count(*) FROM dq_poll_many('t_dead', 10);
CREATE TEMP TABLE keyed_back AS
SELECT dq_dead_redrive_id('t_dead', (
    SELECT id FROM dq_dead_list('t_dead')
    WHERE key = 'kk'
)) AS id;
SELECT is(
    (SELECT id FROM keyed_back),
    (
        SELECT m.id FROM dq_messages AS m
        WHERE m.queue = 't_dead' AND m.key = 'kk'
    ),
    'a keyed dead letter redriven by id: the id of its key''s new message'
);
SELECT dq_dead_purge('t_dead');

-- channels and priorities: the wake-up and turn rules as for offers
SELECT is(
    (SELECT count(*)::int FROM dq_send_many('t_chan', ARRAY['1', '2']::jsonb[], NULL, ARRAY['a', NULL], ARRAY[0, 5])),
    2, 'keyless messages in a channel and with a priority'
);
SELECT results_eq(
    $$SELECT key, channel, priority FROM dq_poll_many('t_chan', 10)$$,
    $$VALUES (NULL::text, NULL::text, 5), (NULL, 'a', 0)$$,
    'delivered by the turn rule'
);

-- bad input: a clear error naming the argument, nothing written
SELECT throws_ok($$SELECT dq_send(NULL, '1')$$, '22004', NULL, 'queue NULL');
SELECT throws_ok($$SELECT dq_send('t_bad', NULL)$$, '22004', 'pgdq: payload must not be NULL', 'payload NULL');
SELECT throws_ok(
    $$SELECT dq_send('t_bad', '1', headers => '[1]')$$, '22023',
    'pgdq: headers must be a JSON object or NULL, got a JSON array', 'headers not an object'
);
SELECT throws_ok(
    $$SELECT dq_send('t_bad', '1', 'infinity')$$, '22023', NULL, 'scheduled_at outside the readable range'
);
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', ARRAY['1', NULL]::jsonb[])$$, '22004', 'pgdq: payloads[2] must not be NULL',
    'a NULL payload element'
);
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', ARRAY['1', '2']::jsonb[], channels => ARRAY['a'])$$, '22023',
    'pgdq: scheduled_ats, channels, priorities and headers must be NULL or have as many elements as payloads (2), got NULL, 1, NULL and NULL',  -- noqa: LT05
    'channels of another length'
);
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', ARRAY['1', '2']::jsonb[], headers => ARRAY['{}', '"x"']::jsonb[])$$, '22023',
    'pgdq: headers[2] must be a JSON object or NULL, got a JSON string', 'a header element not an object'
);
SELECT throws_ok($$SELECT dq_get_id('t_bad', NULL)$$, '22004', 'pgdq: id must not be NULL', 'dq_get_id: id NULL');
-- arrays whose lower bound is not 1: elements are checked, and named, by position
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', '[0:1]={"{}","{}"}'::jsonb[], '[5:6]={infinity,infinity}'::timestamptz[])$$,
    '22023', 'pgdq: scheduled_ats[1] must be a time in years 1 to 9999 UTC, got infinity',
    'a bad time in an array from subscript 5'
);
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', '[0:1]={"{}","{}"}'::jsonb[], NULL, NULL, NULL, '[0:1]={"{}",3}'::jsonb[])$$,
    '22023', 'pgdq: headers[2] must be a JSON object or NULL, got a JSON number',
    'a bad header in an array from subscript 0'
);
SELECT throws_ok(
    $$SELECT dq_send_many('t_bad', '[0:1]={"{}","{}"}'::jsonb[], NULL, '[0:1]={"",x}'::text[])$$,
    '22023', NULL, 'an empty channel in an array from subscript 0'
);
SELECT throws_ok(
    $$SELECT dq_offer_many('t_bad', '[0:1]={"",x}'::text[], '[0:1]={"{}","{}"}'::jsonb[])$$,
    '22023', NULL, 'dq_offer_many: an empty key in an array from subscript 0'
);
SELECT lives_ok(
    $$SELECT dq_send_many('t_ok', '[0:1]={"{}","{}"}'::jsonb[], '[7:8]={NULL,NULL}'::timestamptz[], '[3:4]={a,NULL}'::text[])$$,
    'good arrays from any subscript are taken'
);
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_bad'
    ),
    0,
    'still nothing written by bad input'
);
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_bad'
), 0, 'nothing written by bad input');

SELECT * FROM finish();
ROLLBACK;
