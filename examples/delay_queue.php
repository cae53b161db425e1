<?php
// A client of the delay-queue (ouqiang) HTTP interface, written to that
// project's README, run against `pgdq serve`: push a job to each of two
// topics, pop from both at once (the second pop waits for a delayed job),
// finish them, delete a job nobody popped. It checks every answer and exits
// non-zero on any mismatch. Needs php-cli with the curl extension.
//
//   php examples/delay_queue.php [URL] [TOPIC] [TOPIC]   (default http://127.0.0.1:8080 order mail)
//   DELAY_QUEUE_TOKEN=...  adds "Authorization: Bearer ..." when the server has tokens

declare(strict_types=1);

$url = $argv[1] ?? 'http://127.0.0.1:8080';
$order = $argv[2] ?? 'order';
$mail = $argv[3] ?? 'mail';

// POST a JSON body to url . path; the answer's data, or exit 1 with its message.
function call(string $url, string $path, array $body)
{
    $headers = ['Content-Type: application/json'];
    if (getenv('DELAY_QUEUE_TOKEN')) {
        $headers[] = 'Authorization: Bearer ' . getenv('DELAY_QUEUE_TOKEN');
    }
    $curl = curl_init($url . $path);
    curl_setopt_array($curl, [
        CURLOPT_POST => true,
        CURLOPT_POSTFIELDS => json_encode($body, JSON_THROW_ON_ERROR),
        CURLOPT_HTTPHEADER => $headers,
        CURLOPT_RETURNTRANSFER => true,
        CURLOPT_TIMEOUT => 90,  // a pop waits up to 60 seconds for a job
    ]);
    $raw = curl_exec($curl);
    if ($raw === false) {
        fail("$path: request failed: " . curl_error($curl));
    }
    $answer = json_decode($raw, true);
    if (!is_array($answer) || !array_key_exists('code', $answer) || !array_key_exists('data', $answer)) {
        fail("$path: not a delay-queue answer: $raw");
    }
    if ($answer['code'] !== 0) {
        fail("$path failed (code {$answer['code']}): {$answer['message']}");
    }
    return $answer['data'];
}

function fail(string $why): void
{
    fwrite(STDERR, $why . "\n");
    exit(1);
}

function expect($got, $wanted, string $what): void
{
    if ($got !== $wanted) {
        fail("$what: expected " . json_encode($wanted) . ', got ' . json_encode($got));
    }
}

// Jobs of two topics: the mail is due in 2 seconds, the reminder in an hour (deleted below).
$jobs = [
    [$order, "$order:1", 0, json_encode(['order' => 1, 'reason' => 'unpaid'])],
    [$mail, "$mail:1", 2, json_encode(['to' => 'ann@example.com'])],
    [$mail, "$mail:reminder", 3600, json_encode(['to' => 'bob@example.com'])],
];
foreach ($jobs as [$topic, $id, $delay, $body]) {
    expect(call($url, '/push', ['topic' => $topic, 'id' => $id, 'delay' => $delay, 'ttr' => 30, 'body' => $body]), null, "push $id");
    echo "pushed $id to $topic, due in {$delay}s\n";
}

// One pop names both topics: the order is ready now; the next pop waits for the mail to fall due.
foreach ([$jobs[0], $jobs[1]] as [$topic, $id, $delay, $body]) {
    $job = call($url, '/pop', ['topic' => "$order,$mail"]);
    expect($job, ['id' => $id, 'body' => $body], "pop of $order,$mail");
    echo "popped $id: $body\n";
    expect(call($url, '/finish', ['id' => $id]), null, "finish $id");
    echo "finished $id\n";
}

// The reminder is no longer needed: delete it before it falls due.
expect(call($url, '/delete', ['id' => "$mail:reminder"]), null, 'delete');
echo "deleted $mail:reminder\n";
expect(call($url, '/finish', ['id' => "$order:1"]), null, 'a second finish');
echo "all checks passed\n";
