// The Node Kafka clients the integration tests drive: one operation per run, its
// arguments as JSON in argv[2], its result as one JSON line on stdout.
//
//   {"client": "kafkajs" | "platformatic", "op": ..., "bootstrap": ["host:port"], ...}
//
// ops: metadata {topic} -> {partitions, topicId, brokers}
//      produce {topic, codec, idempotent, count, tag} -> {acks: [[partition, offset]]}
//      consume {topic, group, expected, members, protocol, timeoutMs}
//          -> {records: [[value, partition, offset, headerValue]], events (platformatic)}
//      configs {topic} -> {topic: {name: [value, source]}, broker: {name: [value, source]}}
import { Kafka, CompressionTypes, logLevel } from 'kafkajs'
import * as pk from '@platformatic/kafka'

const args = JSON.parse(process.argv[2])

function done (result) {
  process.stdout.write(JSON.stringify(result) + '\n')
  process.exit(0)
}

function describe (e) {
  if (!e) return String(e)
  const inner = (e.errors || []).map(describe).join('; ')
  const code = e.apiCode !== undefined ? ` (api code ${e.apiCode})` : ''
  return `${e.name}: ${e.message}${code}${inner ? ' [' + inner + ']' : ''}`
}

function describeArg (a) {
  if (a instanceof Error) return describe(a)
  try { return JSON.parse(JSON.stringify(a, (k, v) => typeof v === 'bigint' ? String(v) : v)) } catch { return String(a) }
}

function fail (e) {
  process.stdout.write(JSON.stringify({ error: describe(e) + '\n' + String(e && e.stack) }) + '\n')
  process.exit(1)
}

const deadline = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// -- kafkajs -----------------------------------------------------------------------------

const KAFKAJS_CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP }

async function kafkajs () {
  const kafka = new Kafka({ clientId: 'lakelog-test', brokers: args.bootstrap, logLevel: logLevel.NOTHING })
  if (args.op === 'metadata') {
    const admin = kafka.admin()
    await admin.connect()
    const md = await admin.fetchTopicMetadata({ topics: [args.topic] })
    const cluster = await admin.describeCluster()
    await admin.disconnect()
    return { partitions: md.topics[0].partitions.length, topicId: null, brokers: cluster.brokers.map(b => `${b.host}:${b.port}`) }
  }
  if (args.op === 'produce') {
    const producer = kafka.producer({ idempotent: args.idempotent, maxInFlightRequests: args.idempotent ? 1 : 5 })
    await producer.connect()
    const messages = []
    for (let i = 0; i < args.count; i++) {
      messages.push({ key: `k${i % 7}`, value: `${args.tag}-${i}`, headers: { h: `${args.tag}-${i}` } })
    }
    const acks = []
    for (let i = 0; i < messages.length; i += 50) {
      const res = await producer.send({ topic: args.topic, compression: KAFKAJS_CODECS[args.codec], acks: -1, messages: messages.slice(i, i + 50) })
      for (const r of res) acks.push([r.partition, Number(r.baseOffset)])
    }
    await producer.disconnect()
    return { acks }
  }
  if (args.op === 'consume') {
    const records = []
    const consumers = []
    for (let m = 0; m < args.members; m++) {
      const c = kafka.consumer({ groupId: args.group, sessionTimeout: 10000, heartbeatInterval: 500, maxWaitTimeInMs: 200, rebalanceTimeout: 10000 })
      await c.connect()
      await c.subscribe({ topic: args.topic, fromBeginning: true })
      await c.run({
        autoCommitInterval: 100,
        eachMessage: async ({ partition, message }) => {
          records.push([message.value.toString(), partition, Number(message.offset), message.headers.h ? message.headers.h.toString() : null])
        }
      })
      consumers.push(c)
    }
    const end = Date.now() + args.timeoutMs
    while (records.length < args.expected && Date.now() < end) await deadline(100)
    await deadline(args.settleMs || 500) // anything more would be a duplicate: wait for it
    for (const c of consumers) await c.disconnect() // commits what was read
    return { records }
  }
  if (args.op === 'configs') {
    const admin = kafka.admin()
    await admin.connect()
    const res = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: 2, name: args.topic }, { type: 4, name: args.broker }]
    })
    await admin.disconnect()
    const out = {}
    for (const r of res.resources) {
      const key = r.resourceType === 2 ? 'topic' : 'broker'
      out[key] = Object.fromEntries(r.configEntries.map(e => [e.configName, [e.configValue, e.configSource]]))
    }
    return out
  }
  throw new Error(`unknown op ${args.op}`)
}

// -- @platformatic/kafka -----------------------------------------------------------------

const stringSerde = { serializers: pk.stringSerializers }

async function platformatic () {
  const base = { clientId: 'lakelog-test', bootstrapBrokers: args.bootstrap, retries: 10, retryDelay: 200 }
  if (args.op === 'metadata') {
    const admin = new pk.Admin(base)
    const md = await admin.metadata({ topics: [args.topic] })
    await admin.close()
    const t = md.topics.get(args.topic)
    return { partitions: t.partitionsCount, topicId: t.id, brokers: [...md.brokers.values()].map(b => `${b.host}:${b.port}`) }
  }
  if (args.op === 'produce') {
    const producer = new pk.Producer({ ...base, ...stringSerde, idempotent: args.idempotent, compression: args.codec === 'none' ? undefined : args.codec, acks: -1 })
    const acks = []
    for (let i = 0; i < args.count; i += 50) {
      const messages = []
      for (let j = i; j < Math.min(i + 50, args.count); j++) {
        messages.push({ topic: args.topic, key: `k${j % 7}`, value: `${args.tag}-${j}`, headers: new Map([['h', `${args.tag}-${j}`]]) })
      }
      const res = await producer.send({ messages })
      for (const o of res.offsets) acks.push([o.partition, Number(o.offset)])
    }
    await producer.close()
    return { acks }
  }
  if (args.op === 'consume') {
    const records = []
    const members = []
    const events = [] // [ms since start, member, event, details]: shown when a test fails
    const t0 = Date.now()
    for (let m = 0; m < args.members; m++) {
      const options = { ...base, groupId: args.group, deserializers: pk.stringDeserializers, maxWaitTime: 200 }
      if (args.protocol === 'consumer') Object.assign(options, { groupProtocol: 'consumer' })
      else Object.assign(options, { sessionTimeout: 10000, heartbeatInterval: 500, rebalanceTimeout: 10000 })
      const consumer = new pk.Consumer(options)
      const note = (what) => (...a) => events.push([Date.now() - t0, m, what, a.map(describeArg)])
      for (const what of ['consumer:group:join', 'consumer:group:leave', 'consumer:group:rebalance', 'consumer:rejoin', 'consumer:heartbeat:error', 'error']) {
        consumer.on(what, note(what))
      }
      // @platformatic/kafka 1.35 hands over what a fetch sent before a rebalance returns
      // after it, partitions the member no longer owns included, and its autocommit then
      // commits their offsets: the new owner, starting from that commit, skips records
      // nobody delivered (or, without the commit, a second member reads them). The Java
      // client drops such records. So does this harness (and says so), and it commits
      // itself, every 100 ms, the records it kept.
      const stream = await consumer.consume({ topics: [args.topic], mode: 'committed', fallbackMode: 'earliest', autocommit: false })
      const kept = new Map() // partition -> the last record kept, not yet committed
      const owns = (topic, partition) => {
        const owned = (consumer.assignments || []).find(a => a.topic === topic)
        return owned !== undefined && owned.partitions.includes(partition)
      }
      stream.on('data', (message) => {
        if (!owns(message.topic, message.partition)) {
          note('dropped:not-assigned')(message.partition, Number(message.offset))
          return
        }
        const h = message.headers.get('h')
        records.push([message.value, message.partition, Number(message.offset), h === undefined ? null : String(h)])
        kept.set(message.partition, message)
      })
      stream.on('error', note('stream:error'))
      let committing = Promise.resolve()
      const commit = () => {
        committing = committing.then(async () => {
          const batch = [...kept.values()]
          kept.clear()
          for (const message of batch) {
            try {
              await message.commit()
            } catch (e) {
              note('commit:error')(message.partition, Number(message.offset), e)
              // Tried again only while the partition is still this member's.
              if (!kept.has(message.partition) && owns(message.topic, message.partition)) kept.set(message.partition, message)
            }
          }
        })
        return committing
      }
      const timer = setInterval(commit, 100)
      members.push({ consumer, stream, commit, timer })
    }
    const end = Date.now() + args.timeoutMs
    while (records.length < args.expected && Date.now() < end) await deadline(100)
    await deadline(args.settleMs || 500)
    // Every member stops fetching and commits before any leaves: a member that left hands
    // its partitions to the others, which would read them again from the last commit.
    for (const { stream, commit, timer } of members) {
      clearInterval(timer)
      await stream.close()
      await commit()
    }
    for (const { consumer } of members) await consumer.close(true)
    return { records, events }
  }
  if (args.op === 'configs') {
    const admin = new pk.Admin(base)
    const res = await admin.describeConfigs({
      resources: [{ resourceType: 2, resourceName: args.topic }, { resourceType: 4, resourceName: args.broker }],
      includeSynonyms: false,
      includeDocumentation: false
    })
    await admin.close()
    const out = {}
    for (const r of res) {
      const key = r.resourceType === 2 ? 'topic' : 'broker'
      out[key] = Object.fromEntries(r.configs.map(e => [e.name, [e.value, e.configSource]]))
    }
    return out
  }
  throw new Error(`unknown op ${args.op}`)
}

const clients = { kafkajs, platformatic }
clients[args.client]().then(done, fail)
