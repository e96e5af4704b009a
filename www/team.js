// The demo's team and lists, as server/sql/examples/board.sql seeds them. The server's policies
// decide what each person sees; the page only names the lists and asks for all of them.

export const PEOPLE = [
  { key: "alice", name: "Alice", id: "11111111-1111-4111-8111-111111111111" },
  { key: "bob", name: "Bob", id: "22222222-2222-4222-8222-222222222222" },
  { key: "carol", name: "Carol", id: "33333333-3333-4333-8333-333333333333" },
];

/** Who a card may be assigned to. Dave left the team: the server's foreign key refuses him. */
export const ASSIGNEES = [
  ...PEOPLE.map(({ key, name }) => ({ key, name })),
  { key: "dave", name: "Dave (left the team)" },
];

/** The lists every device pulls; each is a bucket. */
export const LISTS = [
  { id: "launch", name: "Launch", members: ["alice", "bob", "carol"] },
  { id: "design", name: "Design", members: ["alice", "bob"] },
  { id: "ops", name: "Ops", members: ["alice", "carol"] },
];

/** Tens of thousands of cards, pulled only by a device that joins it. */
export const ARCHIVE = { id: "archive", name: "Archive", members: ["alice", "bob", "carol"] };

export const ALL_LISTS = [...LISTS, ARCHIVE];
export const bucketOf = (list) => `board:${list}`;
export const person = (key) => PEOPLE.find((p) => p.key === key) ?? PEOPLE[0];
export const assigneeName = (key) => ASSIGNEES.find((a) => a.key === key)?.name ?? key;
export const listName = (id) => ALL_LISTS.find((l) => l.id === id)?.name ?? id;
