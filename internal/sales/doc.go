// Package sales is the domain of salesagg: decoding and validating sales
// events, folding them into per-product totals, the notification rule, and the
// wire encodings shared with the Kafka Streams application it replaces.
//
// It imports nothing else of the project.
package sales
