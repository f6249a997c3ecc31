package stream

import (
	"context"
	"time"
)

// changelogIdentity is the changelog a store's checkpoint must be of: its
// topic and topic id, and how to name the topic of another id, so that a
// checkpoint of another changelog can be told from one of a recreated
// changelog.
//
// A checkpoint records only its changelog's topic id (state.Checkpoint). A
// different id means either the changelog was deleted and created again
// (its old id is gone) or the store was written against another changelog
// that still exists: a state dir moved from another application.id, or a
// store.name changed (the changelog is <application.id>-<store.name>-changelog).
type changelogIdentity struct {
	topic string
	id    [16]byte
	// nameOf returns the name of the topic with id, "" when no topic this
	// client can see has it (or the broker cannot be asked).
	nameOf func(id [16]byte) string
}

// changelogIdentity returns the identity of the changelog whose topic id
// is id; its nameOf asks the broker's metadata, within ctx.
func (e *env) changelogIdentity(ctx context.Context, id [16]byte) changelogIdentity {
	return changelogIdentity{topic: e.cfg.ChangelogTopic(), id: id, nameOf: func(other [16]byte) string {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		tds, err := e.admin.ListTopics(ctx)
		if err != nil {
			return ""
		}
		for _, td := range tds {
			if [16]byte(td.ID) == other {
				return td.Topic
			}
		}
		return ""
	}}
}
